"""Provenance (pserver.runtime.provenance): roles, hosts, node-local ranks and tree parents."""

from __future__ import annotations

from pserver.plan.config import load_config
from pserver.plan.topology import make_layout
from pserver.runtime.provenance import git_commit, host_lines, mpi_library, rank_table, restarts


def test_rank_table_names_every_ranks_role_host_local_rank_and_parent():
    cfg = load_config(None, ["cluster.tree_fanout=2"])
    layout = make_layout(6, cfg)  # server, stats, data, aggregator 0 with learners 0-1
    nodes = [0, 0, 0, 3, 3, 3]
    hosts = ["a", "a", "a", "b", "b", "b"]
    table = rank_table(layout, nodes, hosts)
    assert [(i.host, i.local_rank) for i in table] == [
        ("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]  # fmt: skip
    agg = table[3]
    assert agg.role == "aggregator 0"
    assert [i.parent for i in table if i.role.startswith("learner")] == [3, 3]
    lines = host_lines(table)
    assert len(lines) == 2 and lines[1].startswith("host b: 3 ranks: 3 aggregator 0, 4 learner 0 "
                                                   "(parent 3)")  # fmt: skip
    with_pids = host_lines(rank_table(layout, nodes, hosts, [100, 101, 102, 200, 201, 202]))
    assert with_pids[1] == ("host b: 3 ranks: 3 aggregator 0 (pid 200), 4 learner 0 (parent 3, "
                            "pid 201), 5 learner 1 (parent 3, pid 202)")  # fmt: skip
    assert rank_table(layout, nodes, hosts, [7] * 6)[4].pid == 7 and table[4].pid == -1


def test_library_line_and_restart_count():
    text = "MPICH Version:      4.3.0\nMPICH Release date: x\n"
    assert mpi_library(text) == "MPICH Version: 4.3.0"
    assert mpi_library("") == "unknown"
    assert mpi_library("Open MPI v5.0.11, ident: 5.0.11 \0") == "Open MPI v5.0.11, ident: 5.0.11"
    assert restarts({"SLURM_RESTART_COUNT": "3"}) == 3 and restarts({}) == 0


def test_no_commit_outside_a_checkout(tmp_path):
    assert git_commit(tmp_path) == ""


def test_reading_the_commit_never_writes_the_checkouts_index(tmp_path):
    """``git status`` refreshes a stale index through ``index.lock``; a job killed meanwhile
    (scancel, a timeout) left that lock behind and broke the user's next git command."""
    import os
    import shutil
    import subprocess

    if shutil.which("git") is None:
        return  # nothing to read: git_commit() is "" (the test above)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")  # fmt: skip

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, env=env,
                       capture_output=True)  # fmt: skip

    git("init", "-q")
    (tmp_path / "f").write_text("a")
    git("add", "f")
    git("commit", "-qm", "x")
    os.utime(tmp_path / "f", (1, 1))  # the index's stat data is stale: status would refresh it
    index = tmp_path / ".git" / "index"
    before = index.stat().st_ino, index.stat().st_mtime_ns
    assert git_commit(tmp_path).endswith("-dirty") is False
    assert (index.stat().st_ino, index.stat().st_mtime_ns) == before

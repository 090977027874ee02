"""Real jobs across three hosts: network namespaces h1..h3 on this machine (scripts/netns-hosts.sh).

Hydra starts one proxy per host through an ssh stand-in, so ranks on different hosts talk over
TCP through a bridge, as on a cluster: this is where MPICH's default UCX netmod lost posted
``MPI_ANY_SOURCE`` receives and every run stalled (docs/architecture.md, "Wildcard receives").
Each case runs twice, the second time with one host's link rate-limited: the job must still end
cleanly with a consistent dump (no timing is asserted). Needs root, ``ip``, ``tc`` and
``unshare``; skipped with the reason where the namespaces cannot be made.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, Result, launcher_is_hydra, mpiexec

from pserver.dump.reader import load_dump

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.multihost,
    pytest.mark.skipif(not launcher_is_hydra(), reason="drives Hydra's -launcher/-launcher-exec "
                       "and hostfile options: MPICH's mpiexec only"),  # fmt: skip
]

SCRIPT = ROOT / "scripts" / "netns-hosts.sh"
SETUP_TIMEOUT = 60.0  # seconds for any netns-hosts.sh call
JOB_TIMEOUT = 120.0  # seconds for one job (two epochs take a few seconds on an idle machine)


@dataclass
class Hosts:
    env: dict[str, str]
    bin: Path

    def script(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), *args], env=self.env, capture_output=True, text=True,
            timeout=SETUP_TIMEOUT,
        )


def cannot_make_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None when they can be tried."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (platform {sys.platform})"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root (running as uid {os.geteuid()})"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (apt-get install {package})"
    return None


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """h1..h3 up for this module; always torn down, also after a failed or hung job."""
    reason = cannot_make_namespaces()
    if reason:
        pytest.skip(reason)
    prefix = f"pt{os.getpid()}-"  # unique: parallel runs on one machine do not collide
    h = Hosts(
        dict(os.environ, NETNS_PREFIX=prefix, NETNS_BIN=str(tmp_path_factory.mktemp("netns"))),
        Path(),
    )
    h.bin = Path(h.env["NETNS_BIN"])
    try:
        up = h.script("up")
        if up.returncode != 0:
            pytest.skip(f"scripts/netns-hosts.sh up failed: {last_line(up.stderr)}")
        probe = subprocess.run(
            [str(h.bin / "nsrun"), "h2", "hostname"], capture_output=True, text=True,
            timeout=SETUP_TIMEOUT,
        )
        if probe.returncode != 0 or probe.stdout.strip() != "h2":
            pytest.skip(f"cannot run a process on host h2: {last_line(probe.stderr)}")
        yield h
    finally:
        h.script("down")  # kills what is left in the namespaces, then deletes them


def run_across(hosts: Hosts, slots: list[int], out: Path, *overrides: str) -> Result:
    """The quickstart on h1..h3 (``slots`` ranks each, in rank order), under a hard timeout."""
    hostfile = out / "hosts"
    out.mkdir(parents=True)
    hostfile.write_text("".join(f"h{i + 1}:{n}\n" for i, n in enumerate(slots)))
    cmd = [
        str(hosts.bin / "nsrun"), "h1",
        mpiexec(), "-launcher", "ssh", "-launcher-exec", str(hosts.bin / "nsssh"),
        "-f", str(hostfile), "-n", str(sum(slots)),
        sys.executable, "-m", "pserver.job.cli", str(QUICKSTART), f"run.out_dir={out}",
        "stats.progress=false", "run.log_level=debug", *overrides,
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=dict(hosts.env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        hosts.script("kill")  # ranks on h2, h3 hang off ssh stand-ins; end them too
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"multi-host job {' '.join(overrides)} hung for {JOB_TIMEOUT:.0f} s\n"
            f"{stdout}\n{stderr[-6000:]}"
        ) from None
    return Result(proc.returncode, stdout, stderr)


def placement(output: str) -> dict[int, str]:
    """rank -> host, from the log lines (every line names its rank and host)."""
    return {int(r): h for r, h in re.findall(r"\[rank (\d+) [^@\]]*@(h\d)\]", output)}


def expected_hosts(slots: list[int]) -> dict[int, str]:
    ranks = iter(range(sum(slots)))
    return {next(ranks): f"h{i + 1}" for i, n in enumerate(slots) for _ in range(n)}


# (hosts' slots, overrides): every wildcard receive of the code runs across hosts here:
# shards, the data server and the statistics server in each case, aggregators in the tree,
# learners serving children in the broadcast tree; shm puts learners beside the shard on h1.
CASES = {
    "hardsync": ([3, 3, 2], ["protocol.name=hardsync", "blocks.count=2"]),
    "async-2shards-tree": (
        [4, 3, 3],
        ["protocol.name=async", "cluster.servers=2", "blocks.count=2", "cluster.tree_fanout=2"],
    ),
    "psp-bcast-nonblocking": (
        [3, 3, 2],
        ["protocol.name=psp", "protocol.c=2", "comm.mode=nonblocking", "cluster.bcast_fanout=2"],
    ),
    "async-shm": ([4, 3, 2], ["protocol.name=async", "comm.transport=shm", "blocks.count=1"]),
}


@pytest.mark.parametrize("slow", [None, "8mbit"], ids=["full-links", "h3-slow"])
@pytest.mark.parametrize("case", list(CASES))
def test_job_across_three_hosts(hosts: Hosts, tmp_path: Path, case: str, slow: str | None):
    slots, overrides = CASES[case]
    if slow:
        shaped = hosts.script("slow", "h3", slow)
        assert shaped.returncode == 0, shaped.stderr
    try:
        res = run_across(hosts, slots, tmp_path / case, "run.epochs=2", *overrides)
    finally:
        if slow:
            hosts.script("nodelay", "h3")
    assert res.returncode == 0, res.output[-6000:]
    assert placement(res.output) == expected_hosts(slots), res.output[-6000:]
    assert_consistent(tmp_path / case / "stats.h5", case)


def assert_consistent(path: Path, case: str) -> None:
    """The dump of a finished run: every learner contributed, clocks and counts agree."""
    dump = load_dump(path)
    assert dump.attrs["finished"]
    n_learners = int(dump.attrs["n_learners"])
    g, u = dump.group("gradients"), dump.group("updates")
    learners = dump.group("learners")
    assert sorted(learners["learner"].tolist()) == list(range(n_learners))
    assert np.all(learners["minibatches"] > 0)
    if "tree" not in case:  # behind a tree, the shards see aggregators' sums, not learners
        assert sorted(set(g["learner"].tolist())) == list(range(n_learners))
    if case == "hardsync":
        assert np.all(g["staleness"] == 0)
    clocks = u["vector_clock"]
    assert np.all((clocks < u["timestamp"][:, None]) | (clocks == -1))
    assert int(dump.group("servers")["updates"].sum()) == len(u["timestamp"])
    test = dump.group("test")
    assert test["epoch"].tolist() == [1.0, 2.0]
    assert test["error"][-1] < 0.5  # chance is 0.9

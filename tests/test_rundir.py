"""Run directories (pserver.runtime.rundir): a new run never replaces an old one; every rank
agrees."""

from __future__ import annotations

import os

import pytest

from pserver.errors import ConfigError
from pserver.runtime.rundir import expand, point_latest, run_id
from pserver.stats.runs import resolve_dump as find_dump


def test_run_id_prefers_the_launchers_then_slurms_then_the_start_time():
    assert run_id({"PSERVER_RUN_ID": "a1", "SLURM_JOB_ID": "77"}) == "a1"
    assert run_id({"SLURM_JOB_ID": "77"}) == "77"  # a requeued job finds its directory again
    stamp = run_id({}, now=0.0, pid=123)
    assert stamp.endswith("-123") and len(stamp) == len("19700101-000000-123")


def test_default_template_makes_one_directory_per_run_and_a_latest_link():
    assert expand("runs/{name}/{id}", "quickstart", "42") == (
        "runs/quickstart/42", __import__("pathlib").Path("runs/quickstart/latest"))
    assert expand("/scratch/x", "q", "42") == ("/scratch/x", None)  # used as it is
    assert expand("out/{id}/dump", "q", "7")[1] is None  # {id} not last: no link


@pytest.mark.parametrize(
    "template, name, fragment",
    [
        ("runs/{nam}/{id}", "q", "unknown placeholder(s) ['nam']"),
        ("runs/{name", "q", "run.out_dir = 'runs/{name'"),
        ("runs/{name}/{id}", "a/b", "run.name = 'a/b' names a directory"),
        ("runs/{name}/{id}", "..", "run.name = '..'"),
    ],
)
def test_bad_templates_and_names_are_refused(template, name, fragment):
    with pytest.raises(ConfigError) as info:
        expand(template, name, "1")
    assert fragment in str(info.value)


def test_latest_is_replaced_atomically_and_never_clobbers_a_real_file(tmp_path):
    for rid in ("1", "2"):
        (tmp_path / rid).mkdir()
        point_latest(tmp_path / "latest", tmp_path / rid)
        assert os.readlink(tmp_path / "latest") == rid  # relative: the runs can move
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "latest"]
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").mkdir()
    with pytest.raises(FileExistsError):
        point_latest(tmp_path / "latest", tmp_path / "1")


def test_find_dump_takes_a_file_a_run_directory_or_a_directory_of_runs(tmp_path):
    run = tmp_path / "q" / "7"
    run.mkdir(parents=True)
    (run / "stats.h5").write_bytes(b"")
    point_latest(tmp_path / "q" / "latest", run)
    assert find_dump(run / "stats.h5") == run / "stats.h5"
    assert find_dump(run) == run / "stats.h5"
    for latest in (tmp_path / "q", tmp_path / "q" / "latest", tmp_path / "q/latest/stats.h5"):
        assert find_dump(latest) == run / "stats.h5"  # the run itself, never latest/
    assert find_dump(tmp_path / "none") == tmp_path / "none"  # the reader says why


def test_no_example_fixes_its_run_directory():
    """Issue 24: an example run twice must not stop at "already holds a dump" — its
    ``run.out_dir`` is the default template or one whose last component holds ``{id}``."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "examples").glob("*.toml")):
        run = tomllib.loads(path.read_text()).get("run", {})
        out = run.get("out_dir", "runs/{name}/{id}")
        assert "{id}" in Path(out).name, f"{path.name}: run.out_dir = {out!r}"

"""A rank file's JSON attributes are validated before training (issue 22, D4, the attributes).

On the code before, ``dump_rows`` set to ``{"train": 0}``-like values or ``0`` passed every
check: the statistics server's restore then cut the dump silently or crashed after start-up
with a traceback; a string step count or a negative timestamp crashed likewise. Now each is one
``pserver-run: error:`` line naming the attribute, exit 2, before anything is written. The
edited file is resealed (its SHA-256 recorded in ``LATEST``), so the checks behind the
manifest's checksum are what is reached.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import h5py
import pytest

from pserver.ckpt.files import latest, rank_file
from tests.mpirun import QUICKSTART, reseal, run_job

pytestmark = pytest.mark.mpi

N = 4  # rank 0 server, 1 stats, 2 data, 3 learner
TIMEOUT = 120.0


def job(*args: str):  # noqa: ANN201 - tests.mpirun.Result
    return run_job(N, [str(QUICKSTART), "stats.progress=false", *args], TIMEOUT)


def edit(ckpt: Path, rank: int, change) -> None:  # noqa: ANN001 - dict -> None
    """Apply ``change`` to rank ``rank``'s attributes in the latest generation, then reseal."""
    path = rank_file(ckpt, latest(ckpt).generation, rank)
    with h5py.File(path, "r+") as f:
        attrs = json.loads(f.attrs["attrs"])
        change(attrs)
        f.attrs["attrs"] = json.dumps(attrs, sort_keys=True)
    reseal(ckpt, rank)


CASES = {
    "dump_rows zero": (1, lambda a: a.update(dump_rows=0), "'dump_rows' is 0, expected dict"),
    "dump_rows negative": (
        1, lambda a: a["dump_rows"].update(train=-5), r"'dump_rows\[train\]' is -5"
    ),
    "dump_rows string": (
        1, lambda a: a["dump_rows"].update(train="84"), r"'dump_rows\[train\]' is '84'"
    ),
    "block ts": (0, lambda a: a["blocks"]["0"].update(ts=-1), "'ts' is -1"),
    "learner steps": (3, lambda a: a.update(steps="x"), "'steps' is 'x', expected int"),
    "sampler pos": (2, lambda a: a["sampler"].update(pos=10**9), "'pos' is 1000000000"),
}


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory) -> Path:  # noqa: ANN001
    out = tmp_path_factory.mktemp("attrs") / "run"
    res = job(f"run.out_dir={out}", "run.epochs=1")
    assert res.returncode == 0, res.output
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_an_edited_attribute_is_refused_before_training(
    checkpointed: Path, tmp_path: Path, case: str
) -> None:
    out = tmp_path / "run"
    shutil.copytree(checkpointed, out)
    rank, change, said = CASES[case]
    edit(out / "checkpoint", rank, change)
    before = (out / "stats.h5").read_bytes()
    res = job("--resume", str(out), "run.epochs=2")
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1, res.output
    assert f"(rank {rank})" in lines[0] and re.search(said, lines[0]), lines[0]
    assert "Traceback" not in res.output
    assert (out / "stats.h5").read_bytes() == before

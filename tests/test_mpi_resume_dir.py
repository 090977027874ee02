"""``pserver-run --resume RUN_DIR`` without CONFIG, from a directory of runs' ``latest`` link,
and the command the exit-75 line prints, run as printed (issue 24 item 1).

The first part of every run has overrides the quickstart file does not have (another strategy,
learning rate and epoch count): a resume that read the file instead of the checkpoint would be
refused ("the config differs") or train another run. Every job runs under a hard timeout
(tests/mpirun.py; the watchdog of ``stop_with_sigterm`` for the one a signal stops).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import h5py
import pytest

from pserver.ckpt.files import latest
from pserver.job import launch
from tests.mpirun import QUICKSTART, ROOT, run_job
from tests.test_mpi_checkpoint import LAMBDA1, TIMEOUT, errors, stop_with_sigterm

pytestmark = pytest.mark.mpi

FIRST = [
    "protocol.name=async", "optim.lr=0.02", "run.epochs=3",
    "inject.compute_time=0.02", "stats.flush_interval=0.1",
]
CONTINUE = re.compile(r"^pserver-run: stopped by a signal .*; continue the run with: (.+)$", re.M)
RESUMED = re.compile(r"resumed run (\S+): checkpoint generation (\d+), (\d+) of (\d+) epochs "
                     r"done, restart (\d+)")


def stopped_run(runs: Path, rid: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A run of FIRST in ``runs/<rid>`` (a run-id template, so ``runs/latest`` points at it)
    stopped by SIGTERM; (its directory, its output)."""
    monkeypatch.setenv("PSERVER_RUN_ID", rid)
    out = runs / rid
    text, _ = stop_with_sigterm(out, [*FIRST, f"run.out_dir={runs}/{{id}}"])
    assert os.readlink(runs / "latest") == rid
    assert latest(out / "checkpoint").extra["stopped"] is True
    return out, text


def assert_finished(out: Path, output: str) -> None:
    """The run in ``out`` ended its 3 epochs as the async run of FIRST, resumed once, and the
    resumed part said what it resumed: the run directory itself, never ``latest``."""
    with h5py.File(out / "stats.h5", "r") as f:
        assert list(f["test/epoch"][()]) == [1, 2, 3]
        assert f.attrs["restarts"] == 1
        assert Path(str(f.attrs["run_dir"])).resolve() == out.resolve()
    saved = latest(out / "checkpoint")
    assert saved.config["protocol"]["name"] == "async"
    assert saved.config["optim"]["lr"] == 0.02
    assert Path(saved.config["run"]["out_dir"]).resolve() == out.resolve()
    (said,) = RESUMED.findall(output)
    run_dir, gen, done, total, restart = said
    assert Path(run_dir).resolve() == out.resolve() and Path(run_dir).name != "latest"
    assert (int(gen), int(total), int(restart)) == (1, 3, 1)
    assert 0 <= int(done) < 3


def test_resume_from_the_latest_link_takes_the_checkpoints_config(tmp_path, monkeypatch):
    """``--resume runs/latest`` and no CONFIG continues the stopped run to its end; the same
    with a CONFIG that disagrees (the quickstart file's hardsync) is one error line, exit 2."""
    runs = tmp_path / "runs"
    out, _ = stopped_run(runs, "first", monkeypatch)
    refused = run_job(LAMBDA1, [str(QUICKSTART), "--resume", str(runs / "latest")], TIMEOUT)
    assert refused.returncode == 2, refused.output
    (line,) = errors(refused.output)
    assert "protocol.name ('async' -> 'hardsync')" in line and "leave CONFIG out" in line
    resumed = run_job(LAMBDA1, ["--resume", str(runs / "latest")], TIMEOUT)
    assert resumed.returncode == 0, resumed.output
    assert_finished(out, resumed.output)


def test_the_exit_75_line_prints_the_command_that_continues_the_run(tmp_path, monkeypatch):
    """The statistics rank's line after a SIGTERM names a command; run as printed (a shell
    line, from the directory the job was started in) it continues the run to its end."""
    out, text = stopped_run(tmp_path / "runs", "first", monkeypatch)
    (command,) = CONTINUE.findall(text)
    words = shlex.split(command)
    assert words[words.index("-n") + 1] == str(LAMBDA1)
    assert words[-2:] == ["--resume", str(out)]
    done = launch.run(["bash", "-c", command], TIMEOUT, cwd=ROOT)  # killed as a group past it
    assert done.returncode == 0, done.output
    assert_finished(out, done.output)

"""``pserver-launch`` and the Python API without MPI: the world size each strategy and layout
needs, the launcher chosen from the environment, bad input, overrides as TOML, and the executor
that passes signals to the job's process group and stops it past its timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import QUICKSTART, ROOT

from pserver.errors import ConfigError
from pserver.job import api, launch, launcher
from pserver.plan.config import load_config, parse_override
from pserver.plan.topology import make_layout

CLI = [sys.executable, "-m", "pserver.job.launcher"]
TIMEOUT = 60  # seconds for any process these tests start


@pytest.mark.parametrize(
    ("overrides", "learners", "size"),
    [
        (["protocol.name=hardsync"], 4, 7),  # 1 shard + stats + data + 4
        (["protocol.name=sync"], 4, 6),  # no shard
        (["protocol.name=adpsgd"], 2, 4),
        (["protocol.name=hardsync", "cluster.servers=2", "blocks.count=4"], 3, 7),
        (["cluster.tree_fanout=2"], 4, 9),  # + 2 aggregators of 2 learners each
    ],
)
def test_the_world_size_is_the_one_the_layout_accepts(overrides, learners, size):
    plan = launcher.resolve(QUICKSTART, learners, overrides, environ={})
    assert plan.size == size and plan.cfg.cluster.learners == learners
    cfg = load_config(QUICKSTART, [*overrides, f"cluster.learners={learners}"])
    layout = make_layout(size, cfg)
    assert len(layout.learners) == learners  # what the ranks will lay out
    assert plan.cmd[-1] == f"cluster.learners={learners}"


def test_the_launcher_follows_the_environment(monkeypatch):
    mpiexec = {launch.MPIEXEC_VAR: "/opt/mpi/bin/mpirun", launch.FLAGS_VAR: "--oversubscribe"}
    assert launcher.prefix(7, mpiexec) == ["/opt/mpi/bin/mpirun", "--oversubscribe", "-n", "7"]
    assert launcher.prefix(7, {**mpiexec, "SLURM_JOB_ID": "12"})[0] == "/opt/mpi/bin/mpirun"
    monkeypatch.setattr(launcher, "is_openmpi", lambda: False)
    assert launcher.prefix(5, {"SLURM_JOB_ID": "12"}) == ["srun", "--mpi=pmi2", "-n", "5"]
    monkeypatch.setattr(launcher, "is_openmpi", lambda: True)
    assert launcher.prefix(5, {"SLURM_JOB_ID": "12"})[:2] == ["srun", "--mpi=pmix"]
    assert launcher.prefix(3, {})[1:] == ["-n", "3"]  # the .venv's mpiexec
    # srun kills its tasks on SIGTERM: signals go through slurmd; a group signal elsewhere
    assert launcher.resolve(QUICKSTART, 2, (), {"SLURM_JOB_ID": "12"}).signaller == [
        "scancel", "--signal={sig}", "12"]
    assert launcher.resolve(QUICKSTART, 2, (), {**mpiexec, "SLURM_JOB_ID": "12"}).signaller is None


def test_the_run_directory_is_known_before_the_launch(tmp_path):
    plan = launcher.resolve(QUICKSTART, 2, [f"run.out_dir={tmp_path}/{{id}}"], {}, rid="r7")
    assert plan.run_dir == tmp_path / "r7" and plan.env["PSERVER_RUN_ID"] == "r7"
    inside = launcher.resolve(QUICKSTART, 2, [f"run.out_dir={tmp_path}/{{id}}"],
                              {"SLURM_JOB_ID": "99"})  # fmt: skip
    assert inside.run_dir == tmp_path / "99"  # a requeued job finds its directory again


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


def test_np_only_and_print_command_start_nothing(tmp_path):
    res = cli(str(QUICKSTART), "--learners", "4", "protocol.name=sync", "--np-only")
    assert (res.returncode, res.stdout) == (0, "6\n")
    out = f"run.out_dir={tmp_path}/x"
    res = cli(str(QUICKSTART), out, "-l", "3", "--print-command")
    assert res.returncode == 0 and "-n 6 " in res.stdout and "cluster.learners=3" in res.stdout
    assert f"# run directory {tmp_path}/x" in res.stdout and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--learners", "4", "protocol.name=nope"], "protocol.name = 'nope'"),
        ([], "say how many with --learners N"),
        (["--learners", "0"], "--learners 0: expected λ >= 1"),
        (["--learners", "2", "--timeout", "0"], "--timeout 0: expected seconds > 0"),
        (["--learners", "2", "bogus.key=1"], "bogus"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    res = cli(str(QUICKSTART), f"run.out_dir={tmp_path}/run", *args)
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("pserver-launch: error: ") and message in line
    assert "Traceback" not in res.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, "3"), (0.05, "0.05"), (1e-05, "1e-05"), (True, "true"), (False, "false"),
     ("sync", '"sync"'), ("a \"b\" \\ c", '"a \\"b\\" \\\\ c"'), ([64, 32], "[64, 32]"),
     ([], "[]"), (float("inf"), "inf"), ("/tmp/x y", '"/tmp/x y"')],
)  # fmt: skip
def test_overrides_are_python_values_written_as_toml(value, text):
    assert api.toml_value(value) == text
    key, parsed = parse_override(f"run.x={text}")  # what pserver-run reads back
    assert parsed == (list(value) if isinstance(value, list) else value)


def test_overrides_as_a_dict_or_as_strings():
    assert api.override_args({"run.epochs": 2, "model.hidden": [8]}) == [
        "run.epochs=2", "model.hidden=[8]"]
    assert api.override_args(["protocol.n=2"]) == ["protocol.n=2"] and api.override_args(None) == []
    with pytest.raises(ConfigError, match="run.x = None"):
        api.override_args({"run.x": None})
    with pytest.raises(ConfigError, match="expected a dict or a list"):
        api.override_args("run.epochs=2")


def test_open_run_follows_latest_to_the_run_itself(tmp_path):
    run = tmp_path / "runs" / "20260101-000000-1"
    run.mkdir(parents=True)
    (run / "stats.h5").write_bytes(b"")
    (tmp_path / "runs" / "latest").symlink_to(run.name)
    for path in (tmp_path / "runs", tmp_path / "runs" / "latest", run, run / "stats.h5"):
        r = api.open_run(path)
        assert r.directory == run.resolve() and r.returncode is None


# A job for the executor: prints "ready" once its signal handling is set (exit 75 on SIGTERM
# and SIGINT, as a checkpointing run does; or both ignored with "ignore"), then waits.
JOB = (
    "import signal, sys\n"
    "how = signal.SIG_IGN if sys.argv[1] == 'ignore' else lambda *a: sys.exit(75)\n"
    "signal.signal(signal.SIGTERM, how)\n"
    "signal.signal(signal.SIGINT, how)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    signal.pause()\n"
)
# The launcher's executor run by a process of its own, which the test signals.
EXECUTOR = (
    "import signal, sys\n"
    "from pserver.job.launcher import execute\n"
    "if sys.argv[1] == 'ignore':  # inherited through exec: ignored from the job's first instant\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "timeout = float(sys.argv[2]) if sys.argv[2] != 'none' else None\n"
    "out = execute([sys.executable, '-c', sys.argv[3], sys.argv[1]], timeout=timeout, grace=1,\n"
    "              signaller=sys.argv[4:] or None)\n"
    "print('exit', out.returncode, out.reason, flush=True)\n"
    "sys.exit(out.returncode)\n"
)


def executor(how: str, timeout: str = "none", signaller: tuple[str, ...] = ()) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", EXECUTOR, how, timeout, JOB, *signaller], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout.readline() == "ready\n"  # the job's, through the executor's stdout
    return proc


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_passed_to_the_job_whose_status_comes_back(sig):
    proc = executor("checkpoint")
    proc.send_signal(sig)  # to the executor alone: the job is in a group of its own
    rc, out, err = finish(proc)
    assert rc == 75, (out, err)  # the job's own status: it stopped on the signal it got
    assert f"passing {sig.name} to the job" in err and "killed" not in out


def test_a_job_that_ignores_the_signal_is_killed_after_the_grace():
    proc = executor("ignore")
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 128 + signal.SIGKILL and "got SIGTERM; killed" in out, (out, err)


def test_past_its_timeout_a_job_is_stopped_then_killed():
    rc, out, err = finish(executor("ignore", timeout="0.5"))
    assert rc == launcher.TIMED_OUT and "timed out after 0.5 s; killed" in out, (out, err)
    assert "passing SIGTERM to the job" in err


def test_under_srun_a_signal_goes_through_the_signaller(tmp_path):
    fake = tmp_path / "scancel"  # records how it was asked, signals nothing
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/asked\n')
    fake.chmod(0o755)
    proc = executor("ignore", signaller=(str(fake), "--signal={sig}", "12"))
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert (tmp_path / "asked").read_text() == "--signal=TERM 12\n"
    assert rc == 128 + signal.SIGKILL and "got SIGTERM; killed" in out, (out, err)

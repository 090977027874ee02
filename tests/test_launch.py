"""pserver.job.launch in one process: the launcher from the environment, the command it builds, the
hard timeout that kills the job's whole process group, the watch that stops a job early."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest
from mpirun import run_job

from pserver.job import launch

# A parent that starts a long-running child in its own process group and prints the child's
# pid before it waits: the grandchild a killed mpiexec would leave behind (a rank).
PARENT = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "child.wait()\n"
)


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether ``pid`` has died (exited or a zombie) by ``within`` seconds from now.

    SIGKILL is delivered asynchronously and a killed orphan is reaped by init later, so the
    test waits on that observable condition, bounded, instead of reading it once.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X") or time.monotonic() > deadline:
            return state in ("Z", "X")
        time.sleep(0.02)


def test_the_environment_names_the_launcher_and_its_flags():
    env = {
        launch.MPIEXEC_VAR: "/opt/openmpi/bin/mpirun",
        launch.FLAGS_VAR: "--oversubscribe  --allow-run-as-root -x 'A=b c'",
    }
    assert launch.mpiexec_program(env) == "/opt/openmpi/bin/mpirun"
    assert launch.launcher_flags(env) == ["--oversubscribe", "--allow-run-as-root", "-x", "A=b c"]
    assert launch.launcher(env) == [
        "/opt/openmpi/bin/mpirun", "--oversubscribe", "--allow-run-as-root", "-x", "A=b c",
    ]  # fmt: skip


def test_a_path_with_spaces_is_one_program_not_split():
    assert launch.launcher({launch.MPIEXEC_VAR: "/my mpi/bin/mpiexec "}) == ["/my mpi/bin/mpiexec"]


def test_unset_or_blank_variables_give_the_default_mpiexec_and_no_flags():
    default = launch.default_mpiexec()
    assert Path(default).name == "mpiexec"
    for env in ({}, {launch.MPIEXEC_VAR: "  ", launch.FLAGS_VAR: ""}):
        assert launch.launcher(env) == [default]


def test_the_default_is_the_mpiexec_beside_this_python_when_there_is_one():
    sibling = Path(sys.executable).parent / "mpiexec"
    if not sibling.exists():
        pytest.skip(f"no mpiexec beside {sys.executable}")
    assert launch.default_mpiexec() == str(sibling)


def test_arguments_override_the_environment():
    env = {launch.MPIEXEC_VAR: "mpirun", launch.FLAGS_VAR: "--oversubscribe"}
    assert launch.launcher(env, program="srun", flags=["--mpi=pmix"]) == ["srun", "--mpi=pmix"]
    assert launch.launcher(env, flags=[]) == ["mpirun"]


def test_unbalanced_quotes_in_the_flags_are_refused_with_the_variable_named():
    with pytest.raises(launch.LaunchError, match=launch.FLAGS_VAR):
        launch.launcher_flags({launch.FLAGS_VAR: "-x 'A=b"})


def test_the_command_puts_the_flags_before_the_rank_count():
    env = {launch.MPIEXEC_VAR: "mpirun", launch.FLAGS_VAR: "--oversubscribe"}
    cmd = launch.mpi_command(3, ["prog", "a"], launch.launcher(env))
    assert cmd == ["mpirun", "--oversubscribe", "-n", "3", "prog", "a"]
    with pytest.raises(launch.LaunchError, match="at least one rank"):
        launch.mpi_command(0, ["prog"], ["mpirun"])


def test_the_command_reads_the_environment_when_no_launcher_is_given(monkeypatch):
    monkeypatch.setenv(launch.MPIEXEC_VAR, "mpirun")
    monkeypatch.setenv(launch.FLAGS_VAR, "--oversubscribe --allow-run-as-root")
    assert launch.mpi_command(2, [*launch.pserver_cli(), "x.toml"]) == [
        "mpirun", "--oversubscribe", "--allow-run-as-root", "-n", "2",
        sys.executable, "-m", "pserver.job.cli", "x.toml",
    ]  # fmt: skip


def test_a_job_that_ends_gives_its_status_and_output():
    res = launch.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=60)
    assert (res.returncode, res.stdout, res.timed_out, res.reason) == (3, "out\n", False, "")
    with pytest.raises(launch.LaunchError, match="exit 3") as err:
        res.check()
    assert not isinstance(err.value, launch.JobKilled)


def test_a_job_past_its_timeout_is_killed_with_its_whole_process_group():
    res = launch.run([sys.executable, "-c", PARENT], timeout=3)
    assert res.timed_out and res.reason == "timed out after 3 s"
    assert res.returncode == -9  # SIGKILL
    child = int(res.stdout.split()[0])  # printed before the timeout: output is kept
    assert gone(child)  # it had 600 s left to sleep: only the kill of its group ends it
    with pytest.raises(launch.JobKilled, match="timed out after 3 s"):
        res.check()


def test_a_watch_that_names_a_reason_kills_the_job_before_its_timeout(tmp_path):
    asked = []
    log = tmp_path / "job.log"

    def watch() -> str | None:
        asked.append(1)
        # the reason comes once the child's pid is in the log (a loaded machine takes a while
        # to start the two Pythons), and not at the first look: the watch is asked again. The
        # log's first lines are the command, itself several lines long: the pid is the line
        # of digits after it
        text = log.read_text().splitlines() if log.exists() else []
        started = len(text) > 1 and text[-1].strip().isdigit()
        return "stuck after its last epoch" if started and len(asked) >= 2 else None

    res = launch.run([sys.executable, "-c", PARENT], timeout=600, log=log, watch=watch, poll=0.2)
    assert res.reason == "stuck after its last epoch" and not res.timed_out
    assert len(asked) >= 2 and res.seconds < 600
    # the log starts with the command, then the job's output (stdout and stderr)
    lines = log.read_text().splitlines()
    assert lines[0].startswith("$ ") and "import subprocess" in lines[0]
    pid = lines[-1]
    assert res.stdout == log.read_text() and res.stderr == ""
    assert gone(int(pid))


def test_a_launcher_that_does_not_exist_is_one_clear_error():
    with pytest.raises(launch.LaunchError, match=launch.MPIEXEC_VAR):
        launch.run(["/nonexistent/mpiexec", "-n", "1", "true"], timeout=10)


def test_the_launch_module_imports_no_mpi():
    """Pure: importing it (as the tests and benchmark drivers do) must not initialize MPI."""
    code = "import sys, pserver.job.launch; print('mpi4py' in sys.modules)"
    res = launch.run([sys.executable, "-c", code], timeout=60, env=os.environ)
    assert res.check().stdout.strip() == "False"


def env_flags(name: str, value: str) -> list[str]:
    """The launcher's flags that set ``name=value`` in every rank (Hydra or Open MPI)."""
    res = launch.run([launch.mpiexec_program(), "--version"], timeout=60)
    if "HYDRA" in res.output:
        return ["-genv", name, value]
    if "Open MPI" in res.output or "OpenRTE" in res.output:
        return ["-x", f"{name}={value}"]
    pytest.skip(f"unknown launcher {launch.mpiexec_program()}: {res.output[:200]}")


@pytest.mark.mpi
def test_the_flags_of_the_environment_reach_mpiexec(monkeypatch):
    """A flag from ``$PSERVER_MPIEXEC_FLAGS`` that sets a variable in the ranks is seen by
    them; a flag mpiexec does not know makes the job fail (the flags are not dropped)."""
    show = [sys.executable, "-c", "import os; print(os.environ.get('PSERVER_LAUNCH_TEST'))"]
    before = os.environ.get(launch.FLAGS_VAR, "")  # e.g. --oversubscribe for Open MPI
    flags = shlex.join(env_flags("PSERVER_LAUNCH_TEST", "from the flags"))
    monkeypatch.setenv(launch.FLAGS_VAR, f"{before} {flags}")
    res = launch.run(launch.mpi_command(1, show), timeout=60).check()
    assert res.stdout.strip() == "from the flags"
    monkeypatch.setenv(launch.FLAGS_VAR, f"{before} --no-such-launcher-flag")
    assert launch.run(launch.mpi_command(1, show), timeout=60).returncode != 0


@pytest.mark.mpi
def test_run_job_adds_the_flags_it_is_given(tmp_path):
    flags = env_flags("PSERVER_LAUNCH_TEST", "1")
    res = run_job(1, [str(tmp_path / "missing.toml")], timeout=60, flags=flags)
    assert res.returncode == 2 and "pserver-run: error:" in res.output, res.output
    assert res.cmd[-len(flags) - 6 : -6] == flags  # after $PSERVER_MPIEXEC_FLAGS, before -n

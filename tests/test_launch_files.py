"""The launch files: the SLURM script is valid bash and runs outside SLURM; the hostfiles parse."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import ROOT, mpiexec

SLURM = ROOT / "scripts" / "pserver.slurm"
HYDRA = ROOT / "hostfiles" / "example.hosts"
OPENMPI = ROOT / "hostfiles" / "example.openmpi"

HOST = r"[A-Za-z0-9][A-Za-z0-9._-]*"
HYDRA_LINE = re.compile(rf"^({HOST})(?::([1-9][0-9]*))?$")  # Hydra: no trailing comments
OPENMPI_LINE = re.compile(rf"^({HOST})(?:\s+slots=([1-9][0-9]*))?(?:\s+max_slots=[1-9][0-9]*)?$")


def entries(path: Path, line_re: re.Pattern[str], strip_comments: bool) -> list[tuple[str, int]]:
    """``[(host, slots), ...]`` of a hostfile; any other line fails the test with its number."""
    out = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = (raw.split("#", 1)[0] if strip_comments else raw).strip()
        if not line or raw.lstrip().startswith("#"):
            continue
        m = line_re.match(line)
        assert m, f"{path.name}:{number}: {raw!r} is not a hostfile entry"
        out.append((m.group(1), int(m.group(2) or 1)))
    assert out, f"{path.name} lists no host"
    return out


def documented_command(path: Path) -> tuple[int, int]:
    """The ``-n N`` and ``cluster.servers=S`` of the example command in the file's comments."""
    text = path.read_text()
    n = re.search(r"-n (\d+) pserver-run", text)
    servers = re.search(r"cluster\.servers=(\d+)", text)
    assert n and servers, f"{path.name} has no example command"
    return int(n.group(1)), int(servers.group(1))


def test_slurm_script_is_valid_bash():
    res = subprocess.run(["bash", "-n", str(SLURM)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_slurm_directives_come_first_and_ask_for_nodes_tasks_and_time():
    lines = SLURM.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    header = []
    for line in lines[1:]:
        if line and not line.startswith("#"):
            break  # sbatch stops reading #SBATCH lines at the first command
        if line.startswith("#SBATCH"):
            header.append(line)
    options = dict(re.fullmatch(r"#SBATCH --([a-z-]+)=(\S+)", h).groups() for h in header)
    assert {"nodes", "ntasks", "time"} <= set(options)
    assert int(options["ntasks"]) >= 4  # a server, the statistics and data servers, a learner
    assert re.fullmatch(r"\d+(:\d\d){1,2}", options["time"])


def test_hostfiles_parse_and_describe_the_same_nodes():
    hydra = entries(HYDRA, HYDRA_LINE, strip_comments=False)
    openmpi = entries(OPENMPI, OPENMPI_LINE, strip_comments=True)
    assert hydra == openmpi
    for path in (HYDRA, OPENMPI):
        n, servers = documented_command(path)
        assert n == sum(slots for _, slots in hydra)  # one rank per slot
        assert servers + 2 <= hydra[0][1]  # shards, statistics and data server on the first host


@pytest.mark.mpi
def test_hydra_accepts_the_example_hostfile(tmp_path):
    """The same file with every host replaced by localhost: Hydra parses it and fills slots."""
    local = tmp_path / "hosts"
    local.write_text(re.sub(rf"^{HOST}:", "localhost:", HYDRA.read_text(), flags=re.M))
    res = subprocess.run(
        [mpiexec(), "-f", str(local), "-n", "3", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.mpi
def test_slurm_script_runs_a_job_with_mpiexec_outside_slurm(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PSERVER_NP="4", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    res = subprocess.run(
        ["bash", str(SLURM), "run.epochs=1", f"run.out_dir={tmp_path}", "stats.progress=false"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "stats.h5").is_file()
    assert "test error" in res.stdout  # the summary printed after the run


@pytest.mark.mpi
def test_slurm_script_passes_sigterm_on_to_every_rank(tmp_path):
    """A signal for the batch script only (scancel --batch, --signal=B:...): it must pass the
    signal on to the launcher, or the ranks train on, orphaned, until SLURM kills them."""
    import signal
    import time

    from pserver.dump.reader import load_dump

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PSERVER_NP="4", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    cmd = ["bash", str(SLURM), "run.epochs=100000", f"run.out_dir={tmp_path}",
           "stats.progress=false", "stats.flush_interval=0.2"]  # fmt: skip
    log = open(tmp_path / "job.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)  # fmt: skip
    try:
        deadline, pause = time.monotonic() + 120, 0.1
        while not (tmp_path / "stats.h5").exists():  # training has started
            assert proc.poll() is None and time.monotonic() < deadline, "no dump appeared"
            time.sleep(pause)
            pause = min(2 * pause, 2.0)
        os.kill(proc.pid, signal.SIGTERM)  # the batch script only, as SLURM's --signal=B:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (tmp_path / "job.log").read_text()
    assert "got SIGTERM; passing it to the ranks" in text, text
    assert proc.returncode != 0 and "pserver.slurm: exit status" in text, text
    with pytest.raises(ProcessLookupError):  # no rank left behind in the job's group
        os.killpg(proc.pid, 0)
    assert load_dump(tmp_path / "stats.h5").attrs["pserver_version"]


@pytest.mark.mpi
def test_slurm_script_turns_the_time_limit_warning_into_a_checkpoint_to_resume(tmp_path):
    """The script's own --signal=B:USR1 (the time limit is near): SIGTERM to every rank, each
    checkpoints, exit 75. Outside SLURM there is no job to requeue, and none is tried; the
    script with PSERVER_RESUME continues the run."""
    import signal
    import time

    from pserver.ckpt.files import latest
    from pserver.dump.reader import load_dump

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PSERVER_NP="4", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    cmd = ["bash", str(SLURM), "run.epochs=100000", f"run.out_dir={tmp_path}",
           "stats.progress=false", "stats.flush_interval=0.2"]  # fmt: skip
    log = open(tmp_path / "job.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)  # fmt: skip
    try:
        deadline, pause = time.monotonic() + 120, 0.1
        while not (tmp_path / "stats.h5").exists():  # training has started
            assert proc.poll() is None and time.monotonic() < deadline, "no dump appeared"
            time.sleep(pause)
            pause = min(2 * pause, 2.0)
        os.kill(proc.pid, signal.SIGUSR1)  # the batch script only, as SLURM's --signal=B:
        proc.wait(timeout=60)
    finally:
        left = group_members(proc.pid)  # none should be: then killed, whatever the outcome
        if left:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    text = (tmp_path / "job.log").read_text()
    assert not left, f"processes of the job left running: {left}\n{text}"
    assert "got SIGUSR1 (the time limit is near); passing SIGTERM to the ranks" in text, text
    assert proc.returncode == 75 and "pserver.slurm: exit status 75" in text, text
    assert "requeue" not in text, text
    manifest = latest(tmp_path / "checkpoint")
    assert manifest is not None and manifest.extra["stopped"]

    # PSERVER_RESUME: a new job continues that run, in place, to a nearer end
    tested = load_dump(tmp_path / "stats.h5").groups.get("test", {}).get("epoch", [])
    epochs = int(max(tested, default=0)) + 2  # no row yet when stopped in epoch 1
    res = subprocess.run(
        ["bash", str(SLURM), f"run.epochs={epochs}", "stats.progress=false"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**env, "PSERVER_RESUME": str(tmp_path)},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"resuming from {tmp_path} (PSERVER_RESUME)" in res.stdout, res.stdout
    dump = load_dump(tmp_path / "stats.h5")
    assert dump.attrs["restarts"] == 1 and max(dump.groups["test"]["epoch"]) == epochs


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    out.append(int(name))
            except OSError:  # gone meanwhile
                continue
    return out

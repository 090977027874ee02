"""scripts/pserver.slurm on a real slurmd: submit, scancel, requeue, srun launch mistakes.

Needs a SLURM controller this user may submit to: an existing one (``sinfo`` answers with an
idle node), or, as root with Debian's slurm-wlm and munge installed (``scripts/test.sh``
installs them in CI), the single-node cluster of ``scripts/slurm-single-node.sh``, started
here and stopped at the end. Otherwise every test skips with the reason. Each job runs under a
hard deadline; a job still queued or running at the end of a test is cancelled.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from mpirun import ROOT

from pserver.ckpt.files import latest
from pserver.dump.reader import load_dump
from pserver.job import launch

pytestmark = pytest.mark.slurm

SCRIPT = ROOT / "scripts" / "pserver.slurm"
CLUSTER = ROOT / "scripts" / "slurm-single-node.sh"
JOB_TIMEOUT = 180.0  # s for one job from submission to its end (a run of 1-2 epochs takes ~5)


def sh(*cmd: str, timeout: float = 60.0, env: dict | None = None) -> launch.Completed:
    return launch.run(list(cmd), timeout, env=env, cwd=ROOT)


def slurm_answers() -> str:
    """"" when sinfo shows a node that takes jobs, else why not."""
    if not shutil.which("sinfo"):
        return "sinfo not found"
    res = sh("sinfo", "-h", "-o", "%T", timeout=20)
    states = res.stdout.split()
    if res.returncode != 0:
        return f"sinfo failed: {res.output.strip()[-200:]}"
    if not any(s.rstrip("*") in ("idle", "mixed", "allocated") for s in states):
        return f"no node takes jobs (sinfo: {states})"
    return ""


@pytest.fixture(scope="module")
def slurm():
    """A SLURM this test can submit to; started (and stopped afterwards) when need be."""
    why = slurm_answers()
    started = False
    if why:
        if os.geteuid() != 0 or not shutil.which("slurmctld") or not shutil.which("munged"):
            pytest.skip(f"no SLURM to submit to ({why}) and none can be started here (needs "
                        "root and Debian's slurmctld, slurmd, munge)")  # fmt: skip
        env = {**os.environ, "NODE_CPUS": "8", "SELECT": "select/cons_tres"}
        res = sh("bash", str(CLUSTER), "start", timeout=90, env=env)
        why = slurm_answers()
        if why:
            pytest.skip(f"slurm-single-node.sh start did not give a cluster: {why}\n{res.output}")
        started = True
    yield
    if started:
        sh("bash", str(CLUSTER), "stop", timeout=60)


def submit(tmp_path: Path, *overrides: str, sbatch=(), env=None) -> str:
    """Submit the batch script; its job id."""
    res = sh(
        "sbatch", "--parsable", f"--output={tmp_path}/%j.out", "--ntasks=5", *sbatch,
        str(SCRIPT), "examples/quickstart.toml", f"run.out_dir={tmp_path}/runs/{{id}}",
        "stats.progress=false", *overrides,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert res.returncode == 0, res.output
    return res.stdout.strip().split(";")[0]


def job_state(job: str) -> str:
    """The job's state in squeue ("" once it has left the queue)."""
    return sh("squeue", "-h", "-j", job, "-o", "%T", timeout=20).stdout.strip()


def wait_for(what: str, ready, timeout: float = JOB_TIMEOUT) -> None:  # noqa: ANN001
    """Until ``ready()``; polls with back-off (0.1 s .. 2 s) up to ``timeout`` s."""
    deadline, pause = time.monotonic() + timeout, 0.1
    while not ready():
        assert time.monotonic() < deadline, f"gave up waiting {timeout:.0f} s for {what}"
        time.sleep(pause)
        pause = min(2 * pause, 2.0)


def finish(job: str, log: Path) -> str:
    """Wait for the job to leave the queue (cancel it past the deadline); its log."""
    try:
        wait_for(f"job {job} to end", lambda: job_state(job) == "")
    finally:
        if job_state(job):
            sh("scancel", job)
    return log.read_text() if log.exists() else ""


def job_processes(job: str) -> list[int]:
    """PIDs of processes whose environment says SLURM_JOB_ID=job (every rank of it)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_JOB_ID={job}".encode() in env:
                out.append(int(proc.name))
    return out


def test_submitted_job_finishes_with_its_dump_in_the_job_directory(slurm, tmp_path):
    job = submit(tmp_path, "run.epochs=2")
    log = finish(job, tmp_path / f"{job}.out")
    assert "pserver.slurm: exit status 0" in log, log
    attrs = load_dump(tmp_path / "runs" / job / "stats.h5").attrs
    assert attrs["launch"]["SLURM_JOB_ID"] == job and attrs["restarts"] == 0
    # 5 ranks under srun: rank 0's layout line (issue 25) counts them
    assert "srun --mpi=pmi2" in log and "λ = 2 learners (ranks 3-4), 1 shard (rank 0)" in log


def test_mpiexec_inside_the_allocation(slurm, tmp_path):
    job = submit(tmp_path, "run.epochs=1", env={"PSERVER_LAUNCHER": "mpiexec"})
    log = finish(job, tmp_path / f"{job}.out")
    assert "pserver.slurm: exit status 0" in log and "mpiexec" in log, log
    assert (tmp_path / "runs" / job / "stats.h5").is_file()


def test_scancel_ends_every_rank_with_a_readable_dump(slurm, tmp_path):
    job = submit(tmp_path, "run.epochs=100000", "stats.flush_interval=0.2")
    dump = tmp_path / "runs" / job / "stats.h5"
    try:
        wait_for("the first flush of the dump", dump.exists)
    finally:
        sh("scancel", job)
    finish(job, tmp_path / f"{job}.out")
    wait_for(f"every process of job {job} to exit", lambda: not job_processes(job), 60)
    assert load_dump(dump).attrs["pserver_version"]  # readable: the last complete flush


def test_requeued_job_resumes_in_its_directory_without_hanging(slurm, tmp_path):
    """The second attempt has the job id, and so the step's MPICH segment name, of the first
    one, which was killed in training: without the clean-up its MPI_Init waited forever. The
    requeue's SIGTERM makes every rank of the first attempt write a checkpoint (exit 75), and
    the second attempt resumes from it in the same run directory."""
    job = submit(tmp_path, "run.epochs=100000", "stats.flush_interval=0.2",
                 sbatch=("--requeue",))  # fmt: skip
    out, log = tmp_path / "runs" / job, tmp_path / f"{job}.out"
    try:
        wait_for("the first attempt's dump", (out / "stats.h5").exists)
        assert sh("scontrol", "requeue", job).returncode == 0
        wait_for("the requeue", lambda: job_state(job) == "PENDING")
        # SLURM holds a requeued job for about two minutes (its begin time); not here
        assert start_requeued(job, log).returncode == 0
        # the second attempt is past MPI_Init once a shard of it serves its blocks again
        wait_for("the second attempt's training", lambda: "restart 1 of job" in log.read_text()
                 and log.read_text().count("serving blocks") >= 2)  # fmt: skip
    finally:
        sh("scancel", job)
    text = finish(job, log)
    assert "pserver.slurm: exit status 75" in text, text  # the first attempt's checkpoint
    assert f"restart 1 of job {job}: resuming from {out}" in text, text
    assert (out / "checkpoint" / "LATEST").is_file()
    assert not (out / "stats.restart-0.h5").exists()  # one dump, continued in place
    assert load_dump(out / "stats.h5").attrs["restarts"] == 1


def start_requeued(job: str, log: Path, *updates: str) -> launch.Completed:
    """``scontrol update JobId=job [updates] StartTime=now`` for a requeued job, once its first
    attempt is over.

    SLURM holds a requeued job about two minutes, and that hold is what keeps a race away: the
    requeue revokes the first attempt's job credential, and slurmd refuses every credential of
    that job issued up to the second of the revocation (credentials carry whole seconds). A
    second attempt allocated within that second is killed at once ("Killing non-startable
    batch job: Job credential revoked" in slurmctld's log) and never runs. The first attempt's
    batch script logs its exit status after the revocation, so once that line is in and the
    clock has passed its second, the new attempt's credential is newer than the revocation."""
    wait_for("the first attempt's end", lambda: "pserver.slurm: exit status" in read(log))
    ended = int(time.time())
    wait_for("the second after the first attempt's end", lambda: int(time.time()) > ended, 5.0)
    return sh("scontrol", "update", f"JobId={job}", *updates, "StartTime=now")


def elapsed_s(job: str) -> int:
    """Seconds the job has run (squeue's ``[D-][H:]M:SS``)."""
    text = sh("squeue", "-h", "-j", job, "-o", "%M", timeout=20).stdout.strip()
    days, _, clock = text.rpartition("-")
    secs = 0
    for part in clock.split(":"):
        secs = 60 * secs + int(part)
    return secs + 86400 * int(days or 0)


def read(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def test_time_limit_checkpoints_and_the_job_requeues_itself_to_finish(slurm, tmp_path):
    """SLURM's own time limit and its warning signal, end to end: the script's USR1 trap stops
    the ranks (checkpoint, exit 75) and requeues the job, whose next attempt resumes and ends.

    SLURM checks time limits every 30 s and sends ``--signal`` up to 30 s early, so with the
    smallest limit (1 minute) the signal can come before a loaded machine has started the
    ranks. The job is therefore submitted with 5 minutes and a 90 s warning, and the limit is
    lowered (as its owner may) once training runs, to the whole minutes that leave 60-120 s:
    the warning then comes at SLURM's next check (within 30 s), the limit itself at least 30 s
    after it. The requeued attempt gets its 5 minutes back (an operator's update: root, as the
    test cluster runs) and its two-minute hold lifted, so it finishes the run without a second
    time limit. The run: 12 epochs of at least 4.2 s each (2 learners x 42 minibatches of
    ``inject.compute_time`` = 0.1 s), longer than the first attempt's at most ~35 s of
    training."""
    job = submit(tmp_path, "run.epochs=12", "inject.compute_time=0.1", "stats.flush_interval=0.5",
                 sbatch=("--requeue", "--time=5", "--signal=B:USR1@90"))  # fmt: skip
    out, log = tmp_path / "runs" / job, tmp_path / f"{job}.out"
    try:
        wait_for("the first attempt's training", lambda: "serving blocks" in read(log))
        minutes = elapsed_s(job) // 60 + 2
        res = sh("scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
        assert res.returncode == 0, res.output
        wait_for("the time limit's requeue", lambda: "requeueing job" in read(log)
                 and "pserver.slurm: exit status" in read(log)
                 and job_state(job) == "PENDING")  # fmt: skip
        first = read(log)
        assert "got SIGUSR1 (the time limit is near); passing SIGTERM to the ranks" in first
        assert "pserver.slurm: exit status 75" in first and "DUE TO TIME LIMIT" not in first
        assert "checkpoint generation 1 committed" in first, first
        manifest = latest(out / "checkpoint")
        assert manifest is not None and manifest.generation == 1 and manifest.extra["stopped"]
        stopped = load_dump(out / "stats.h5")  # readable, as the stopped attempt left it
        tested = stopped.groups.get("test", {}).get("epoch", [])  # none when stopped in epoch 1
        assert stopped.attrs["restarts"] == 0 and len(tested) < 12
        res = start_requeued(job, log, "TimeLimit=5")
        if res.returncode != 0:
            pytest.skip(f"cannot give the requeued job its time back: {res.output.strip()}")
        wait_for("the resumed attempt's end", lambda: job_state(job) == "")
    finally:
        sh("scancel", job)
    text = finish(job, log)
    assert f"restart 1 of job {job}: resuming from {out}" in text, text
    assert text.rstrip().endswith("pserver.slurm: exit status 0"), text
    dump = load_dump(out / "stats.h5")  # one dump, continued in place, counting the restart
    assert dump.attrs["restarts"] == 1 and "finished" in dump.attrs
    assert list(dump.groups["test"]["epoch"])[-1] == 12
    assert not (out / "stats.restart-0.h5").exists()
    assert latest(out / "checkpoint").generation == 2


def test_srun_without_mpi_plugin_says_so_once(slurm, tmp_path):
    res = sh(
        "srun", "--mpi=none", "-n", "4", "--chdir", str(ROOT), launch.pserver_cli()[0],
        "-m", "pserver.job.cli", "examples/quickstart.toml", f"run.out_dir={tmp_path}",
        timeout=JOB_TIMEOUT,
    )  # fmt: skip
    errors = [ln for ln in res.output.splitlines() if "pserver-run: error:" in ln]
    assert len(errors) == 1 and "srun --mpi=pmi2" in errors[0], res.output
    assert res.returncode == 2, res.output

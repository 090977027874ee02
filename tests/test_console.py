"""``pserver-run --list``, ``--print-config``, ``--dry-run`` (pserver.job.console) and the pure
parts of ``--resume RUN_DIR`` (pserver.job.resume_dir): one process, no MPI (issue 24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pserver import strategies
from pserver.ckpt.files import CheckpointError, commit, rank_file
from pserver.errors import ConfigError
from pserver.job.console import strategies_text, to_toml
from pserver.job.resume_dir import (
    ConfigSource,
    continue_command,
    launcher_words,
    pserver_words,
    resolve_run_dir,
)
from pserver.plan.config import load_config
from pserver.plan.layout_line import layout_line
from pserver.plan.topology import make_layout

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.toml"
EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.toml")) if "study" not in p.name]
TIMEOUT = 60


def cli(*args: str, code: str = "") -> subprocess.CompletedProcess:
    """``python -m pserver.job.cli ARGS`` in a process without a launcher's environment (or,
    with ``code``, that Python run after ``main(ARGS)``, which is in ``rc``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "HYD", "OMPI"))}
    if code:
        script = f"import sys\nfrom pserver.job.cli import main\nrc = main({list(args)!r})\n{code}"
        cmd = [sys.executable, "-c", script]
    else:
        cmd = [sys.executable, "-m", "pserver.job.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def one_error(done: subprocess.CompletedProcess) -> str:
    """The single ``pserver-run: error:`` line of a refused command (exit 2, no traceback)."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pserver-run: error: "), done.stderr
    return lines[0]


# -- --list -----------------------------------------------------------------------------------


def test_list_names_every_strategy_with_its_family_and_keys():
    """Each strategy's block holds its family and every key it uses, with the default."""
    done = cli("--list")
    assert done.returncode == 0, done.stderr
    assert done.stdout == strategies_text()
    blocks = {}
    heads = [ln for ln in done.stdout.splitlines() if not ln.startswith(" ")]
    assert [h.split(" ")[0] for h in heads] == list(strategies.REGISTRY)
    text = done.stdout
    for i, s in enumerate(strategies.REGISTRY.values()):
        start = text.index(f"{s.name} ({s.family} family): {s.summary}")
        nxt = list(strategies.REGISTRY)[i + 1] if i + 1 < len(strategies.REGISTRY) else None
        block = text[start:text.index(f"\n{nxt} (") if nxt else len(text)]
        blocks[s.name] = block
        keys = [*s.params, *s.shared, *(p for layer in s.layers for p in layer.params)]
        for p in keys:
            default = json.dumps(p.default) if not isinstance(p.default, bool) else (
                str(p.default).lower())
            assert f"protocol.{p.key} = {default}" in block, (s.name, p.key)
            assert p.help in block
        others = set(strategies.params()) - {p.key for p in keys}
        assert not any(f"protocol.{k} =" in block for k in others), s.name
    assert "protocol.tau = 8" in blocks["bmuf"] and "protocol.n = 1" in blocks["softsync"]


# -- --print-config ---------------------------------------------------------------------------


def test_print_config_is_the_resolved_config_as_toml():
    """Parsed back with tomllib, the printed TOML is load_config's result, overrides and the
    strategy's resolutions (no shard under sync) included."""
    overrides = ["protocol.name=sync", "optim.lr=0.01", 'run.name="a \\"quoted\\" λ"']
    done = cli(str(QUICKSTART), *overrides, "--print-config")
    assert done.returncode == 0, done.stderr
    expected = load_config(QUICKSTART, overrides).to_dict()
    assert tomllib.loads(done.stdout) == expected
    assert expected["cluster"]["servers"] == 0 and expected["optim"]["lr"] == 0.01


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_round_trips_through_the_toml_writer(path):
    cfg = load_config(path).to_dict()
    assert tomllib.loads(to_toml(cfg)) == cfg


def test_the_toml_writer_keeps_awkward_strings():
    cfg = load_config(None).to_dict()
    cfg["run"]["name"] = 'tab\t, newline\n, quote ", backslash \\, del \x7f, é, 𝜎'
    cfg["model"]["hidden"] = []
    assert tomllib.loads(to_toml(cfg)) == cfg


# -- --dry-run --------------------------------------------------------------------------------


def test_dry_run_prints_the_layout_and_imports_neither_mpi_nor_torch():
    """A torch model's config: validated and laid out without mpi4py.MPI or torch imported."""
    args = [str(ROOT / "examples" / "torch_cnn.toml"), "cluster.learners=4", "--dry-run"]
    code = "print(json.dumps([rc, 'mpi4py.MPI' in sys.modules, 'torch' in sys.modules]))"
    done = cli(*args, code=f"import json\n{code}")
    assert done.returncode == 0, done.stderr
    *lines, last = done.stdout.splitlines()
    assert json.loads(last) == [0, False, False]
    cfg = load_config(args[0], args[1:2])
    n = 2 + cfg.cluster.servers + 4
    expected = layout_line(make_layout(n, cfg), cfg.protocol.name)
    assert expected in lines
    assert f"world size: mpiexec -n {n} for cluster.learners = 4 under {cfg.protocol.name}" in lines


def test_dry_run_with_np_checks_that_it_fits():
    cfg = load_config(QUICKSTART, ["protocol.name=sync"])
    done = cli(str(QUICKSTART), "protocol.name=sync", "--dry-run", "--np", "6")
    assert done.returncode == 0, done.stderr
    assert layout_line(make_layout(6, cfg), "sync") in done.stdout.splitlines()
    assert "--np 6: fits" in done.stdout
    line = one_error(cli(str(QUICKSTART), "cluster.learners=4", "--dry-run", "--np", "5"))
    assert "mpiexec -n 7" in line
    line = one_error(cli(str(QUICKSTART), "protocol.name=adpsgd", "--dry-run", "--np", "3"))
    assert "adpsgd" in line


@pytest.mark.parametrize("args", [
    [str(QUICKSTART), "protocol.name=bogus", "--dry-run"],
    [str(QUICKSTART), "optim.bogus=1", "--print-config"],
    [str(ROOT / "no-such.toml"), "--print-config"],
    [str(QUICKSTART), "--np", "4"],
    ["--dry-run"],
])
def test_bad_input_is_one_error_line_and_exit_2(args):
    one_error(cli(*args))


# -- --resume RUN_DIR: which run, which config ------------------------------------------------


def fake_run(parent: Path, rid: str, overrides: list[str]) -> Path:
    """A run directory with a dump file and a committed checkpoint manifest of the config."""
    run = parent / rid
    (run / "checkpoint").mkdir(parents=True)
    (run / "stats.h5").write_bytes(b"")
    cfg = load_config(QUICKSTART, [*overrides, f"run.out_dir={json.dumps(str(run))}"])
    rank_file(run / "checkpoint", 1, 0).parent.mkdir()
    rank_file(run / "checkpoint", 1, 0).write_bytes(b"")  # the manifest needs one rank's file
    commit(run / "checkpoint", 1, 1, cfg.to_dict(), {"restarts": 0, "epochs_done": 1})
    return run


def test_resolve_run_dir_follows_latest_to_the_run_itself(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    run = fake_run(runs, "20260101-000000-1", [])
    (runs / "latest").symlink_to(run.name)
    for given in (runs, runs / "latest", run, run / "stats.h5", f"{runs}/latest/"):
        assert resolve_run_dir(str(given)) == str(run.resolve())
    monkeypatch.chdir(tmp_path)  # below the working directory: relative, as a user types it
    assert resolve_run_dir("runs/latest") == "runs/20260101-000000-1"
    with pytest.raises(CheckpointError, match="no checkpoint there .runs/nothing does not exist"):
        resolve_run_dir("runs/nothing")
    (runs / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint there .* without a dump"):
        resolve_run_dir("runs/empty")


def test_the_config_comes_from_the_checkpoint_with_the_overrides_on_top(tmp_path):
    run = fake_run(tmp_path, "r", ["protocol.name=async", "optim.lr=0.02", "run.epochs=3"])
    (tmp_path / "latest").symlink_to("r")
    cfg = ConfigSource(None, ["run.epochs=5"], str(tmp_path / "latest")).load()
    assert (cfg.protocol.name, cfg.optim.lr, cfg.run.epochs) == ("async", 0.02, 5)
    assert cfg.run.out_dir == str(run.resolve()) and cfg.run.overwrite
    with pytest.raises(ConfigError, match="protocol.c = 2 belongs to psp"):
        ConfigSource(None, ["protocol.c=2"], str(run)).load()  # typed, unused: refused
    empty = tmp_path / "e"
    (empty / "checkpoint").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        ConfigSource(None, [], str(empty)).load()


def test_a_learners_only_checkpoint_reloads_without_shards(tmp_path):
    """The stored config is resolved (cluster.servers = 0 under sync): loaded again as it is,
    neither refused nor listed as the file's unread keys."""
    run = fake_run(tmp_path, "r", ["protocol.name=sync"])
    cfg = ConfigSource(None, [], str(run)).load()
    assert cfg.cluster.servers == 0 and not cfg.set_aside
    from pserver.plan.config import unread

    assert unread(cfg) == []


# -- the command that continues a stopped run -------------------------------------------------


def test_the_launcher_is_named_as_the_job_was_started(tmp_path):
    py = tmp_path / "bin" / "python"
    py.parent.mkdir()
    (py.parent / "mpiexec").write_text("")
    exe = str(py)
    assert launcher_words(7, {"HYDI_CONTROL_FD": "5", "PMI_SIZE": "7"}, exe) == [
        str(py.parent / "mpiexec"), "-n", "7"]  # not on PATH: by its path
    assert launcher_words(7, {}, "/nowhere/python") == ["mpiexec", "-n", "7"]
    srun = {"SLURM_STEP_NUM_TASKS": "7", "SLURM_PROCID": "3", "SLURM_MPI_TYPE": "pmi2"}
    assert launcher_words(7, srun, exe) == ["srun", "--mpi=pmi2", "-n", "7"]
    assert launcher_words(7, {"OMPI_COMM_WORLD_SIZE": "7"}, "/nowhere/python")[0] == "mpirun"
    # Hydra over srun (one proxy per node): the step's task count is not the world's
    hydra = {**srun, "SLURM_STEP_NUM_TASKS": "2", "HYDI_CONTROL_FD": "5"}
    assert launcher_words(7, hydra, "/nowhere/python")[0] == "mpiexec"


def test_the_continue_command_runs_this_program_with_resume():
    cli_file = str(ROOT / "pserver" / "job" / "cli.py")
    assert pserver_words(cli_file, "/py/bin/python") == ["/py/bin/python", "-m", "pserver.job.cli"]
    assert pserver_words("/nowhere/bin/pserver-run") == ["pserver-run"]
    line = continue_command("runs/a b", 4, {}, cli_file, "/nowhere/python")
    assert line == "mpiexec -n 4 /nowhere/python -m pserver.job.cli --resume 'runs/a b'"


def test_under_a_launcher_only_its_rank_0_speaks():
    """``mpiexec -n 3 pserver-run … --dry-run``: every process answers alone, rank 1 silently
    with the same exit status (a launcher's variables, as Hydra sets them)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "HYD", "OMPI"))}
    for rank, args, code in [(0, ["--list"], 0), (1, ["--list"], 0), (1, ["--dry-run"], 2)]:
        env = {**base, "PMI_SIZE": "3", "PMI_RANK": str(rank)}
        done = subprocess.run([sys.executable, "-m", "pserver.job.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
        assert done.returncode == code, done.stderr
        assert bool(done.stdout + done.stderr) == (rank == 0)

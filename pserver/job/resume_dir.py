"""``pserver-run --resume RUN_DIR [CONFIG] [key=value ...]``: which run, which config, and the
command that continues a stopped run.

RUN_DIR is named the way ``pserver-stats`` takes a run (``pserver.stats.runs.resolve_dump``): a
run directory, its ``stats.h5``, a directory of runs (its ``latest`` link: the newest run), or
the ``latest`` link itself. It is resolved once to the real run directory, links followed, so
the dump, the checkpoint manifest and every log line name the run itself, never ``…/latest``
(which moves with the next run started there).

The config is the checkpoint's (``LATEST``'s ``config``: the checkpointed run's resolved
config), with the overrides on top; a resumed run may change only the keys of
``pserver.ckpt.files.MAY_CHANGE``, which ``pserver.ckpt.resume.open_resume`` checks. A CONFIG
given as well is loaded as before and must agree with the checkpoint in the same way.

Entry-point layer, no MPI: every rank calls :meth:`ConfigSource.load`, and a failure is a
``PserverError`` that the start-up agreement turns into one ``pserver-run: error:`` line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pserver.errors import ConfigError
from pserver.plan.config import Config, load_config, load_resolved
from pserver.runtime.rundir import DUMP_NAME

if TYPE_CHECKING:
    from pserver.ckpt.files import Manifest

# pserver.ckpt and pserver.stats are imported where a resume needs them: they bring h5py, which
# a run without --resume and ``--dry-run`` (pserver.job.console: imported before MPI) do without


def resolve_run_dir(given: str) -> str:
    """The run directory ``given`` names (module docstring), relative to the working directory
    when it lies below it (as the user typed it, links resolved), else absolute."""
    from pserver.ckpt.files import CheckpointError
    from pserver.dump.reader import DumpError
    from pserver.stats.runs import resolve_dump

    path = Path(given)
    nothing = f"--resume {given}: no checkpoint there"
    if not path.exists():
        raise CheckpointError(f"{nothing} ({given} does not exist)")
    if path.is_dir() and (path / "checkpoint").is_dir():
        run = path  # a run directory, even one whose dump went missing (open_resume says so)
    else:
        try:
            dump = resolve_dump(path)
        except DumpError as e:
            raise CheckpointError(f"{nothing} (no checkpoint/ in it, and {e})") from None
        if dump.name != DUMP_NAME or not dump.is_file():
            raise CheckpointError(
                f"{nothing}: expected a run directory (with {DUMP_NAME} and checkpoint/), a "
                "directory of runs with a 'latest' link, or a run's dump"
            )
        run = dump.parent
    real = Path(os.path.realpath(run))
    try:
        return str(real.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(real)


def checkpoint_manifest(run_dir: str, given: str) -> Manifest:
    """The committed ``LATEST`` manifest of ``run_dir`` (``given``: as the user named it)."""
    from pserver.ckpt.files import CheckpointError, latest
    from pserver.ckpt.resume import checkpoint_dir

    ckpt = checkpoint_dir(run_dir)
    manifest = latest(ckpt)
    if manifest is None:
        raise CheckpointError(
            f"--resume {given}: no checkpoint there ({ckpt / 'LATEST'} does not exist)"
        )
    return manifest


@dataclass
class ConfigSource:
    """Where this rank's config comes from: CONFIG and the overrides, or with ``resume`` the
    checkpoint in it (CONFIG, when given, checked against it by ``open_resume``)."""

    config: str | None
    overrides: list[str]
    resume: str | None = None
    _run_dir: str | None = field(default=None, repr=False)

    def run_dir(self) -> str:
        """``--resume``'s run directory, resolved once (:func:`resolve_run_dir`)."""
        assert self.resume is not None
        if self._run_dir is None:
            self._run_dir = resolve_run_dir(self.resume)
        return self._run_dir

    def load(self) -> Config:
        """The validated config of this run."""
        if self.resume is None:
            return load_config(self.config, self.overrides)
        run_dir = self.run_dir()
        # the dump continues in place, next to the checkpoint
        overrides = [*self.overrides, f"run.out_dir={json.dumps(run_dir)}", "run.overwrite=true"]
        if self.config is not None:
            return load_config(self.config, overrides)
        manifest = checkpoint_manifest(run_dir, self.resume)
        try:
            return load_resolved(manifest.config, overrides)
        except ConfigError as e:  # an override, or a key this version no longer knows: say whose
            raise ConfigError(f"--resume {self.resume}: the checkpoint's config: {e}") from None


def resumed_line(resume: Any, cfg: Config) -> str:
    """What rank 0 logs at the start of a resumed run: the run, the generation, the epochs
    done of the total, and the restarts counted so far (this one included)."""
    from pserver.ckpt.resume import epochs_done

    done = epochs_done(resume.manifest)
    return (
        f"resumed run {resume.run_dir}: checkpoint generation {resume.manifest.generation}, "
        f"{done} of {cfg.run.epochs} epochs done, restart {resume.restarts}"
    )


# -- the command that continues a stopped run -------------------------------------------------


def launcher_words(world_size: int, environ: Mapping[str, str] | None = None,
                   executable: str | None = None) -> list[str]:
    """``[launcher, -n, N]`` as this job was most likely started: MPICH's Hydra (it sets
    ``HYDI_CONTROL_FD``) -> its ``mpiexec``, srun (its step has as many tasks as the world) ->
    ``srun`` with the step's ``--mpi`` plugin, Open MPI (``OMPI_COMM_WORLD_SIZE``) -> its
    ``mpirun``; otherwise ``mpiexec``. The launcher beside this Python (the environment's own
    MPI) is named by its full path unless the same program is first on PATH."""
    env = os.environ if environ is None else environ
    here = Path(executable or sys.executable).parent
    n = ["-n", str(world_size)]
    if "HYDI_CONTROL_FD" in env:
        return [program(here / "mpiexec", "mpiexec"), *n]
    if env.get("SLURM_STEP_NUM_TASKS") == str(world_size) and "SLURM_PROCID" in env:
        plugin = env.get("SLURM_MPI_TYPE", "")
        return ["srun", *([f"--mpi={plugin}"] if plugin and plugin != "none" else []), *n]
    if "OMPI_COMM_WORLD_SIZE" in env:
        return [program(here / "mpirun", "mpirun"), *n]
    return [program(here / "mpiexec", "mpiexec"), *n]


def program(beside: Path, name: str) -> str:
    """``name`` when ``beside`` is missing or is what PATH finds for ``name``; else its path."""
    if not beside.exists():
        return name
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(beside):
        return name
    return str(beside)


def pserver_words(argv0: str | None = None, executable: str | None = None) -> list[str]:
    """How this rank's program was started: ``python -m pserver.job.cli`` or the
    ``pserver-run`` script (by name when PATH finds it, else by its path)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).name == "cli.py" and Path(argv0).parent.name == "job":
        return [executable or sys.executable, "-m", "pserver.job.cli"]
    return [program(Path(argv0), Path(argv0).name)]


def continue_command(run_dir: str, world_size: int, environ: Mapping[str, str] | None = None,
                     argv0: str | None = None, executable: str | None = None) -> str:
    """The shell line that continues the run in ``run_dir``: its config and overrides are in
    the checkpoint, so ``--resume`` alone is enough."""
    words = [*launcher_words(world_size, environ, executable), *pserver_words(argv0, executable)]
    return shlex.join([*words, "--resume", run_dir])


def stopped_line(run_dir: str, world_size: int) -> str:
    """What the statistics rank prints when a signal stopped the run and its checkpoint is
    committed (exit status 75)."""
    from pserver.ckpt.files import latest
    from pserver.ckpt.resume import checkpoint_dir

    manifest = latest(checkpoint_dir(run_dir))
    gen = f"checkpoint generation {manifest.generation}" if manifest else "the checkpoint"
    return (
        f"pserver-run: stopped by a signal (exit status 75), {gen} committed in {run_dir}; "
        f"continue the run with: {continue_command(run_dir, world_size)}"
    )

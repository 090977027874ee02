"""The Python API: launch a job, or open a finished one, and read it back (docs/api.md).

    import pserver
    r = pserver.run("examples/quickstart.toml", learners=4,
                    overrides={"protocol.name": "sync", "run.epochs": 2})
    r.ok, r.returncode, r.directory        # the run directory itself, never a `latest` link
    r.summary()["test"]["final_error"]    # what `pserver-stats summary --json` prints
    r.frames()["test"]                     # a pandas DataFrame per group of the dump
    pserver.open_run("runs/quickstart")    # the same for a run on disk (its latest run)

:func:`run` is ``pserver-launch`` (:mod:`pserver.job.launcher`): the same world size, launcher,
signal handling and timeout. Each call gets a run id of its own (unless ``$PSERVER_RUN_ID`` is
set), so calls in a loop, even inside one SLURM allocation, never share a run directory.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pserver.errors import ConfigError
from pserver.job import launcher
from pserver.runtime.rundir import DUMP_NAME, RUN_ID_VAR

if TYPE_CHECKING:
    import pandas as pd

Overrides = Mapping[str, Any] | Sequence[str] | None


@dataclass
class Run:
    """One run: its directory, and for a run launched here its exit status and output.

    ``returncode`` is None for a run opened from disk; ``reason`` says why the launcher stopped
    the job ("" when it ended by itself); ``command`` is what was run; ``output`` the job's
    output when it went to a log file (``log=``), else ""."""

    directory: Path
    returncode: int | None = None
    reason: str = ""
    command: str = ""
    output: str = ""
    seconds: float = 0.0

    @property
    def dump(self) -> Path:
        return self.directory / DUMP_NAME

    @property
    def ok(self) -> bool:
        """A launched run: exit status 0; an opened one: its dump says it finished."""
        if self.returncode is not None:
            return self.returncode == 0
        return self.dump.is_file() and "finished" in self._load().attrs

    def summary(self) -> dict[str, Any]:
        """The dictionary ``pserver-stats summary --json`` prints for this run."""
        from pserver.stats.runs import summary_json

        return summary_json(self.dump)

    def frames(self) -> dict[str, pd.DataFrame]:
        """A pandas DataFrame per group of the dump (:func:`pserver.stats.read_frames`; its
        ``staleness`` distribution under the key ``"staleness"`` when the run has one)."""
        from pserver.stats.frames import read_frames

        f = read_frames(self.dump)
        out = dict(f.frames)
        if f.staleness is not None and len(f.staleness):
            out.setdefault("staleness", f.staleness)
        return out

    def _load(self) -> Any:
        from pserver.dump.reader import load_dump

        return load_dump(self.dump)


def run(
    config: str | Path,
    learners: int | None = None,
    overrides: Overrides = None,
    *,
    timeout: float | None = None,
    grace: float = launcher.GRACE,
    log: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Run:
    """Launch ``config`` on ``learners`` learners (None: the config's ``cluster.learners``)
    and wait for it; the :class:`Run`, whatever its exit status.

    ``overrides``: ``{"section.key": value}`` with Python values (int, float, bool, str, or a
    list of them), or ``"section.key=value"`` strings as on the command line. ``timeout``:
    seconds before the job is stopped (SIGTERM, then SIGKILL ``grace`` s later). ``log``: a
    file for the job's output (read back into ``Run.output``); without it the output streams
    to this process's. ``env``: the job's whole environment (default: this process's).
    Bad input raises :class:`~pserver.errors.PserverError` before anything starts; a SIGINT or
    SIGTERM that came while the job ran is passed to it, then raised here again.
    """
    environ = dict(os.environ if env is None else env)
    args = override_args(overrides)
    rid = environ.get(RUN_ID_VAR, "").strip()
    if rid:
        plan = launcher.resolve(config, learners, args, environ, rid)
    else:  # a fresh id per call: two runs never share a directory
        plan = fresh(config, learners, args, environ)
    out = launcher.execute(plan.cmd, plan.env, timeout, grace, log, plan.signaller)
    r = Run(plan.run_dir.resolve(), out.returncode, out.reason, plan.command, seconds=out.seconds)
    if log is not None:
        r.output = Path(log).read_text(errors="replace")
    if out.signalled is not None:  # the job has ended: now stop the caller as it asked
        signal.raise_signal(out.signalled)
    return r


def fresh(
    config: str | Path, learners: int | None, args: Sequence[str], environ: dict[str, str]
) -> launcher.Plan:
    """The plan with a run id whose directory does not exist yet: this second's stamp and
    process id, ``-2``, ``-3``, … added where that directory exists."""
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for k in range(1, 1000):
        plan = launcher.resolve(config, learners, args, environ, base if k == 1 else f"{base}-{k}")
        if "{id}" not in plan.cfg.run.out_dir or not plan.run_dir.exists():
            return plan
    raise ConfigError(f"no free run directory beside {plan.run_dir}")


def open_run(path: str | Path) -> Run:
    """The :class:`Run` of a run on disk: a ``stats.h5``, a run directory, a directory of runs
    or its ``latest`` link (:func:`pserver.stats.runs.resolve_dump`); the directory is the one
    the link pointed at when opened."""
    from pserver.stats.runs import resolve_dump

    return Run(resolve_dump(path).resolve().parent)


def override_args(overrides: Overrides) -> list[str]:
    """``section.key=value`` strings of ``overrides`` (:func:`toml_value` for the values)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{key}={toml_value(value, key)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        raise ConfigError(f"overrides = {overrides!r}: expected a dict or a list of key=value")
    return [str(item) for item in overrides]


def toml_value(value: Any, key: str = "") -> str:
    """``value`` in TOML syntax, as ``pserver-run``'s ``key=value`` reads it."""
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v, key) for v in value) + "]"
    raise ConfigError(
        f"override {key} = {value!r}: a {type(value).__name__} has no TOML form here; expected "
        "int, float, bool, str or a list of them"
    )

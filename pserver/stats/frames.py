"""The dump as pandas DataFrames: the reader API for notebooks and scripts.

    from pserver.stats import read_frames, compare_frame
    f = read_frames("runs/a")                 # a dump file, a run directory, or runs/<name>
    f.test.plot(x="time", y="error")          # f.<group>: a DataFrame per group of docs/stats.md
    f.config["protocol.n"], f.attrs["n_learners"], f.summary["samples_per_s"]
    compare_frame(["runs/a", "runs/b"])       # one row per run: label, errors, time, ⟨σ⟩, ...

pandas is an optional dependency (``pip install -e .[pandas]``; ``scripts/setup.sh`` installs
it with the test extras): only this module needs it, and without it these functions raise
:class:`FramesError` saying so. ``pserver-stats compare``/``export`` work without pandas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pserver.dump.reader import Dump, summarize
from pserver.dump.schema import GROUPS
from pserver.errors import PserverError
from pserver.stats.compare_seeds import comparison_rows
from pserver.stats.runs import load_run
from pserver.stats.tables import group_table, run_config, staleness_distribution

if TYPE_CHECKING:
    import pandas as pd


class FramesError(PserverError):
    """pandas is missing (the DataFrame API needs it)."""


def pandas() -> Any:
    """The pandas module, or :class:`FramesError` with how to install it."""
    try:
        import pandas as pd
    except ImportError:
        raise FramesError(
            "the DataFrame API of pserver.stats needs pandas: pip install -e '.[pandas]' "
            "(pserver-stats compare/export work without it)"
        ) from None
    return pd


@dataclass
class Frames:
    """One run: a DataFrame per group (``frames``; empty for an absent group, also reachable
    as attributes: ``f.test``), the flat config, the root attributes and the summary."""

    path: Path
    config: dict[str, Any]
    attrs: dict[str, Any]
    summary: dict[str, Any]
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    staleness: pd.DataFrame | None = None  # σ, count, probability over the applied gradients

    def __getattr__(self, name: str) -> pd.DataFrame:
        frames = self.__dict__.get("frames", {})
        if name in frames:
            return frames[name]
        if name not in GROUPS:  # a typo is an error, not an empty table
            raise AttributeError(f"no group {name!r} in a dump (docs/stats.md: {list(GROUPS)})")
        return pandas().DataFrame()  # a group of the schema this dump does not have: no rows


def group_frame(dump: Dump, name: str) -> pd.DataFrame:
    """Group ``name`` of a loaded dump as a DataFrame (vector clocks as strings)."""
    return pandas().DataFrame(group_table(dump, name))


def read_frames(run: str | Path) -> Frames:
    """Every group of ``run`` (a dump file or a run directory, :mod:`pserver.stats.runs`)."""
    pd = pandas()
    dump = load_run(run)
    return Frames(
        path=dump.path,
        config=run_config(dump),
        attrs=dict(dump.attrs),
        summary=summarize(dump),
        frames={name: group_frame(dump, name) for name in dump.groups},
        staleness=pd.DataFrame(staleness_distribution(dump)),
    )


def read_frame(run: str | Path, group: str) -> pd.DataFrame:
    """One group of ``run`` as a DataFrame (empty if the dump has none)."""
    return group_frame(load_run(run), group)


def compare_frame(runs: Sequence[str | Path]) -> pd.DataFrame:
    """One row per run, or per experiment where runs differ only in seed (mean, ``*_std``):
    its label (the config keys in which the runs differ), then the columns of
    :data:`pserver.stats.tables.RUN_COLUMNS` and
    :data:`pserver.stats.compare_seeds.GROUP_COLUMNS`, then each differing key's value."""
    pd = pandas()
    dumps = [load_run(r) for r in runs]
    return pd.DataFrame(comparison_rows(dumps))

"""Statistics dump of a run: the HDF5 writer, its reader and the ``pserver-stats`` tool.

The reader API for notebooks and scripts (pandas DataFrames, :mod:`pserver.stats.frames`)::

    from pserver.stats import read_frames, read_frame, compare_frame
    f = read_frames("runs/a")           # a stats.h5, its run directory, or runs/<name>/latest
    f.test, f.train, f.updates, f.gradients, f.staleness, f.config, f.summary
    compare_frame(["runs/a", "runs/b"]) # one row per run, labelled by the differing keys

Loaded on first use, so importing ``pserver.dump.schema`` or the writer needs no pandas.
"""

from __future__ import annotations

from typing import Any

#: the DataFrame API: name -> its module (PEP 562 lazy attributes)
LAZY = {
    "read_frames": "pserver.stats.frames",
    "read_frame": "pserver.stats.frames",
    "compare_frame": "pserver.stats.frames",
    "Frames": "pserver.stats.frames",
    "load_run": "pserver.stats.runs",
    "resolve_dump": "pserver.stats.runs",
}


def __getattr__(name: str) -> Any:
    if name not in LAZY:
        raise AttributeError(f"module 'pserver.stats' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(LAZY[name]), name)

"""Which dump a user means by RUN: a ``stats.h5`` file, a run directory, or a directory of runs.

``pserver-stats compare``/``export`` and the :mod:`pserver.stats.frames` API take any of

* the dump file itself (``runs/x/stats.h5``);
* a run directory holding ``stats.h5`` (``runs/x``);
* a directory of runs whose ``latest`` link points at a run directory (``runs/quickstart``,
  where ``run.out_dir`` is a template with ``{id}``), or that link: its latest run, named by
  its own directory (never ``…/latest``);
* a directory with exactly one ``*/stats.h5`` below it.

Anything else is a :class:`~pserver.dump.reader.DumpError` naming what was looked for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pserver.dump.reader import Dump, DumpError, load_dump, summarize
from pserver.runtime.rundir import (  # one spelling of the names a run directory has
    DUMP_NAME,
    LATEST,
)


def resolve_dump(run: str | Path) -> Path:
    """The dump file of ``run`` (module docstring); a path that is not a directory as it is.

    A ``latest`` link on the way is replaced by the run it points at now, so that what a
    caller records (the compare table's ``dump``, the summary's ``path``) names that run and
    still does once a newer run has moved the link."""
    p = Path(run)
    if not p.is_dir():
        return followed(p.parent) / p.name if p.parent.name == LATEST else p
    p = followed(p)
    for candidate in (p / DUMP_NAME, followed(p / LATEST) / DUMP_NAME):
        if candidate.is_file():
            return candidate
    below = sorted(p.glob(f"*/{DUMP_NAME}"))
    if len(below) == 1:
        return below[0]
    if below:
        names = ", ".join(str(b.parent.name) for b in below[:5])
        raise DumpError(
            f"{p} holds {len(below)} runs ({names}{', …' if len(below) > 5 else ''}) and no "
            f"{LATEST!r} link: name one of them"
        )
    raise DumpError(
        f"{p} is a directory without a dump: no {DUMP_NAME}, {LATEST}/{DUMP_NAME} or "
        f"*/{DUMP_NAME} in it"
    )


def followed(link: Path) -> Path:
    """``link``'s target when it is a ``latest`` link (relative to its directory, as
    :func:`pserver.runtime.rundir.point_latest` makes it), else ``link`` itself."""
    if link.name != LATEST or not link.is_symlink():
        return link
    return link.parent / os.readlink(link)  # an absolute target replaces the parent


def load_run(run: str | Path) -> Dump:
    """:func:`~pserver.dump.reader.load_dump` of :func:`resolve_dump` (``run``)."""
    return load_dump(resolve_dump(run))


def summary_json(run: str | Path) -> dict[str, Any]:
    """The summary of ``run`` as ``pserver-stats summary --json`` prints it: JSON's types
    (string keys, lists for tuples), so the API's dictionary and the printed one are equal."""
    return json.loads(json.dumps(summarize(load_run(run))))

"""Where a run writes: ``run.out_dir`` expanded from ``{name}`` and ``{id}``; the ``latest`` link.

A new run must never destroy an old one by default, and every rank must agree on the
directory without talking about it after start-up. So ``run.out_dir`` is a template, by default
``runs/{name}/{id}``: ``{name}`` is ``run.name``, ``{id}`` the run id, one string chosen once per
launch (:func:`run_id`) and broadcast from rank 0 before anything can fail (``pserver.job.cli``).
The run id is, in this order:

* ``$PSERVER_RUN_ID``, set by a launcher script that wants a known directory;
* ``$SLURM_JOB_ID``: a requeued job keeps its id, so it finds its run directory again (its
  earlier dump is set aside by ``scripts/pserver.slurm``, never overwritten);
* the start time on rank 0, ``YYYYmmdd-HHMMSS-PID`` (sortable; the PID keeps two runs started
  in the same second apart).

When the template's last component holds ``{id}``, its parent gets a symbolic link ``latest``
to the newest run started there (replaced atomically by the statistics server once training
starts, :func:`point_latest`), so ``pserver-stats summary runs/quickstart`` reads the last run.
A ``run.out_dir`` without placeholders is used as it is: an existing dump there is refused
unless ``run.overwrite = true`` (``pserver.runtime.outdir``).

Pure: no MPI. ``python -m pserver.runtime.rundir CONFIG [overrides]`` prints the run directory a
launch
with this environment will use (``scripts/pserver.slurm`` asks it, with ``$PSERVER_RUN_ID`` set).
"""

from __future__ import annotations

import os
import string
import time
from collections.abc import Mapping
from pathlib import Path

from pserver.errors import ConfigError

DEFAULT_TEMPLATE = "runs/{name}/{id}"
FIELDS = ("name", "id")
LATEST = "latest"
DUMP_NAME = "stats.h5"
RUN_ID_VAR = "PSERVER_RUN_ID"


def run_id(environ: Mapping[str, str] | None = None, now: float | None = None,
           pid: int | None = None) -> str:
    """This launch's run id (module docstring); asked on rank 0 only."""
    env = os.environ if environ is None else environ
    for var in (RUN_ID_VAR, "SLURM_JOB_ID"):
        value = env.get(var, "").strip()
        if value:
            return value
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return f"{stamp}-{os.getpid() if pid is None else pid}"


def placeholders(template: str) -> list[str]:
    """The ``{field}`` names of ``template``; a malformed brace raises ConfigError."""
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ConfigError(
            f"run.out_dir = {template!r}: {e} (write {{{{ and }}}} for literal braces)"
        ) from None


def expand(template: str, name: str, rid: str) -> tuple[str, Path | None]:
    """(the run directory, the ``latest`` link to point at it or None) for ``template``."""
    fields = placeholders(template)
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ConfigError(
            f"run.out_dir = {template!r}: unknown placeholder(s) {unknown}; expected "
            "{name} (run.name) and {id} (the run id: $PSERVER_RUN_ID, $SLURM_JOB_ID or the "
            "start time)"
        )
    if "name" in fields:
        check_component("run.name", name)
    check_component("the run id", rid)
    out = template.format(name=name, id=rid)
    last = Path(template).name
    link = Path(out).parent / LATEST if "{id}" in last and Path(out).name != LATEST else None
    return out, link


def check_component(key: str, value: str) -> None:
    """``value`` becomes one directory name: no separator, not empty, not ``.``/``..``."""
    if not value or "/" in value or "\0" in value or value in (".", ".."):
        raise ConfigError(
            f"{key} = {value!r} names a directory of run.out_dir, so it must be one path "
            "component: not empty, no '/', not '.' or '..'"
        )


def point_latest(link: Path, target: Path) -> None:
    """Make ``link`` a relative symbolic link to ``target`` (its sibling), atomically.

    A new link is made under a temporary name and renamed over the old one, so a reader sees
    the old or the new run, never no link. Anything other than a link in the way is left
    alone (raises FileExistsError).
    """
    if link.exists() and not link.is_symlink():
        raise FileExistsError(f"{link} exists and is not a symbolic link: not replaced")
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target.name, tmp)
    os.replace(tmp, link)


def main(argv: list[str] | None = None) -> int:
    """Print the run directory of ``CONFIG [overrides]`` for this environment's run id."""
    import sys

    from pserver.errors import PserverError
    from pserver.plan.config import load_config

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(
            "usage: python -m pserver.runtime.rundir CONFIG [section.key=value ...]",
            file=sys.stderr,
        )
        return 2
    try:
        cfg = load_config(args[0], args[1:])
        print(expand(cfg.run.out_dir, cfg.run.name, run_id())[0])
    except PserverError as e:
        print(f"pserver-run: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

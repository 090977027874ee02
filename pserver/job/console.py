"""``pserver-run --list | --print-config | --dry-run [--np N]``: answered in one process, no MPI.

``pserver.job.cli.main`` hands these to :func:`handle` before it imports ``mpi4py.MPI`` (which
initializes MPI), so they run without a launcher, in a fraction of a second, and import neither
MPI nor PyTorch:

* ``--list``: every strategy of the registry (``pserver.strategies.REGISTRY``), its family,
  what it needs beside the learners, and its ``protocol.*`` keys with their defaults, bounds
  and meaning, read from the descriptors (the registry's ``Param``s), never copied by hand;
* ``CONFIG [key=value ...] --print-config``: the resolved config as TOML, every section and key
  with the overrides applied and the strategy's resolutions made (what ``load_config`` returns;
  with ``--resume RUN_DIR``, the config the resumed run will have);
* ``CONFIG [key=value ...] --dry-run [--np N]``: the config validated, with the checks
  start-up makes that need no data, model or MPI (the layout of N ranks, the strategy's shard
  protocol and its least λ, the injected faults against λ); the layout line; the world size
  the strategy needs for ``cluster.learners``; and whether ``--np N`` fits.

Bad input is one ``pserver-run: error: …`` line and exit status 2, as in a real launch. Under a
launcher (``mpiexec -n 7 pserver-run … --dry-run``) only the launcher's rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pserver.errors import PserverError
from pserver.job.launchcheck import launcher_world
from pserver.plan.config import SECTIONS, Config
from pserver.plan.layout_line import layout_line
from pserver.plan.topology import make_layout
from pserver.runtime.rundir import expand

OPTIONS = ("list", "print_config", "dry_run")


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of this module on ``pserver-run``'s parser."""
    g = p.add_argument_group("without MPI (answered in one process, nothing launched)")
    g.add_argument("--list", action="store_true",
                   help="list every strategy (protocol.name), its family and its keys")
    g.add_argument("--print-config", action="store_true",
                   help="print the resolved config as TOML (the overrides applied)")
    g.add_argument("--dry-run", action="store_true",
                   help="validate the config and print its layout and the world size it needs")
    g.add_argument("--np", type=int, metavar="N",
                   help="with --dry-run: the world size to check (mpiexec -n N)")


def asked(args: argparse.Namespace) -> bool:
    """Whether the command line asks for one of this module's answers (``--np`` alone too:
    :func:`handle` refuses it, before a run would start without it)."""
    return any(getattr(args, o, False) for o in OPTIONS) or getattr(args, "np", None) is not None


def handle(args: argparse.Namespace) -> int:
    """Answer ``--list``, ``--print-config`` or ``--dry-run``; the exit status."""
    speaks = (launcher_world(os.environ) or (1, 0, ""))[1] == 0  # the launcher's rank 0 only
    try:
        text = answer(args)
    except PserverError as e:
        if speaks:
            print(f"pserver-run: error: {e}", file=sys.stderr, flush=True)
        return 2
    if speaks:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def answer(args: argparse.Namespace) -> str:
    """The text of ``--list``, ``--print-config`` or ``--dry-run``; ``PserverError`` on bad
    input."""
    if args.list:
        return strategies_text()
    if args.config is None and args.resume is None:
        raise PserverError("--print-config and --dry-run need CONFIG (or --resume RUN_DIR)")
    if args.np is not None and not args.dry_run:
        raise PserverError("--np N goes with --dry-run")
    from pserver.job.resume_dir import ConfigSource

    cfg = ConfigSource(args.config, args.overrides, args.resume).load()
    return to_toml(cfg.to_dict()) if args.print_config else dry_run(cfg, args.np)


# -- --list -----------------------------------------------------------------------------------


def strategies_text() -> str:
    """Every strategy with its family, its ranks and its keys (from the registry)."""
    from pserver import strategies

    lines = []
    for s in strategies.REGISTRY.values():
        beside = "shards, statistics and data servers" if s.ranks.servers else (
            "statistics and data servers, no shard")
        least = f"; at least {s.min_learners} learners" if s.min_learners > 1 else ""
        lines += [f"{s.name} ({s.family} family): {s.summary}",
                  f"    ranks: learners + {beside}{least}"]
        groups = [("its keys", s.params), ("its family's keys", s.shared)]
        groups += [(f"with protocol.{layer.params[0].key} = true ({layer.name})", layer.params)
                   for layer in s.layers]
        for title, params in groups:
            if params:
                lines.append(f"    {title}:")
                lines += [f"        {param_line(p)}" for p in params]
        if not (s.params or s.shared):
            lines.append("    no protocol.* keys of its own")
    return "\n".join(lines) + "\n"


def param_line(p: Any) -> str:
    """``protocol.n = 1 (> 0): update after ⌊λ/n⌋ gradients``."""
    bound = f" ({p.bound})" if p.bound else ""
    return f"protocol.{p.key} = {toml_value(p.default)}{bound}: {p.help or p.type.__name__}"


# -- --print-config ---------------------------------------------------------------------------
# A writer of its own rather than tomli-w: a config is flat tables of numbers, strings, booleans
# and flat lists, which take a few lines, and every rank's environment would need the package.


def toml_value(v: Any) -> str:
    """One TOML value: bool, int, finite float, string or a flat list of those."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)  # repr of a float always has '.' or 'e': a TOML float
    if isinstance(v, str):  # JSON's escapes are TOML's; DEL is allowed raw in JSON only
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML value for {v!r}")  # a config field of a new type: extend here


def to_toml(tables: dict[str, dict[str, Any]]) -> str:
    """The TOML text of ``Config.to_dict()``: one table per section, in the config's order."""
    parts = []
    for section in SECTIONS:
        body = "\n".join(f"{k} = {toml_value(v)}" for k, v in tables[section].items())
        parts.append(f"[{section}]\n{body}\n")
    return "\n".join(parts)


# -- --dry-run --------------------------------------------------------------------------------

#: λ values shown for a config that leaves the learner count to the world size
SHOWN_LAMBDAS = (1, 2, 4, 8, 16)


def dry_run(cfg: Config, np: int | None) -> str:
    """The lines of ``--dry-run``; a ``PserverError`` when the config or ``np`` does not fit."""
    from pserver.plan.study import world_size
    from pserver.strategies import lookup

    s = lookup(cfg.protocol.name)
    lines = [f"config valid: protocol.name = {json.dumps(s.name)} ({s.family} family), "
             f"run directory {expand(cfg.run.out_dir, cfg.run.name, '<id>')[0]}"]
    if cfg.cluster.learners:
        need = world_size(cfg)
        lines.append(f"world size: mpiexec -n {need} for cluster.learners = "
                     f"{cfg.cluster.learners} under {s.name}")
    else:
        sizes = ", ".join(f"-n {lambda_world(cfg, lam)} for λ = {lam}" for lam in SHOWN_LAMBDAS)
        lines.append("world size: cluster.learners = 0 (every rank left is a learner): "
                     f"mpiexec {sizes}")
    n = np if np is not None else (world_size(cfg) if cfg.cluster.learners else None)
    if n is None:
        lines.append("layout: give --np N for the layout of a job of N ranks")
    else:
        if n < 1:
            raise PserverError(f"--np {n}: expected a world size >= 1")
        lines.append(check_world(cfg, n))
        if np is not None:
            lines.append(f"--np {np}: fits")
    return "\n".join(lines) + "\n"


def lambda_world(cfg: Config, lam: int) -> int:
    """The world size that gives ``lam`` learners under ``cfg``'s strategy and layout."""
    import copy

    from pserver.plan.study import world_size

    fixed = copy.deepcopy(cfg)
    fixed.cluster.learners = lam
    return world_size(fixed)


def check_world(cfg: Config, n: int) -> str:
    """The layout line of ``n`` ranks, after start-up's checks that need only λ."""
    from pserver.plan.config import check_fail_learner, inject_plan
    from pserver.strategies import lookup

    layout = make_layout(n, cfg)
    lam = len(layout.learners)
    s = lookup(cfg.protocol.name)
    if s.protocol is not None:  # a shard protocol that cannot run with this λ fails here
        s.protocol(cfg, lam)
    if lam < s.min_learners:
        raise PserverError(f"protocol.name = {s.name!r} needs at least {s.min_learners} "
                           f"learners, {n} ranks give {lam}")
    inject_plan(cfg).validate(len(layout.servers), lam)
    check_fail_learner(cfg, lam)
    c = cfg.cluster
    return layout_line(layout, cfg.protocol.name, c.tree_fanout, c.bcast_fanout)

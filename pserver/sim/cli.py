"""``pserver-sim CONFIG [section.key=value …] [--calibrate RUN_DIR]``: simulate a run.

The config and overrides are ``pserver-run``'s (``pserver.plan.config.load_config``), with
λ = ``cluster.learners``; the dump goes where the real run's would (``run.out_dir``). With
``--calibrate RUN_DIR`` the ``[sim]`` cost model is first fitted to a real run's dump
(``pserver.sim.calibrate``), printed, written to ``sim.toml`` beside the new dump, and used
(an override typed on the command line still wins). Bad input: one
``pserver-sim: error: …`` line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import sys

from pserver.errors import PserverError

PROG = "pserver-sim"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=PROG, description="Simulate a run of pserver-run (docs/simulation.md)."
    )
    ap.add_argument("config", help="TOML config, as for pserver-run")
    ap.add_argument("overrides", nargs="*", help="section.key=value (cluster.learners sets λ)")
    ap.add_argument("--calibrate", metavar="RUN_DIR",
                    help="fit [sim] to a real run's dump (a run directory or its stats.h5)")
    return ap.parse_intermixed_args(argv)  # overrides before and after --calibrate


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except PserverError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    from pserver.plan.config import load_config
    from pserver.sim.engine import simulate

    overrides = list(args.overrides)
    fitted = None
    if args.calibrate:
        from pserver.sim.calibrate import calibrate, fit_lines, overrides_of

        fitted = calibrate(args.calibrate)
        typed = {o.partition("=")[0].strip() for o in overrides}
        overrides = [o for o in overrides_of(fitted) if o.partition("=")[0] not in typed]
        overrides += list(args.overrides)
        for line in fit_lines(fitted, args.calibrate):
            print(line)
    cfg = load_config(args.config, overrides)
    out = simulate(cfg)
    if fitted is not None:
        from pserver.sim.calibrate import write_fit

        write_fit(fitted, out.dump.parent / "sim.toml", args.calibrate)
    print(
        f"simulated {cfg.cluster.learners} learners of {cfg.protocol.name}: {out.updates} "
        f"updates in {out.sim_time:.3f} simulated s; {out.events} events in {out.wall:.1f} s, "
        f"peak RSS {out.peak_rss_mib:.0f} MiB; dump {out.dump}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

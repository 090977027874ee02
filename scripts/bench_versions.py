#!/usr/bin/env python3
"""The version bookkeeping of a shard block per update, in one process, against the update itself.

A shard serves pulls from versions (``pserver.protocols.versions.VersionPool``, driven by
``pserver.roles.shard_versions.ServedVersions``): every update asks for a version no send reads
(``new_version``: drive the current version's sends, then write in place or copy-on-write) and
every pull answered with weights pins the current version (``can_pin``, ``pin_send``). This
script replays that sequence for an async block with ``--readers`` learners, each update
followed by one answered pull, with no MPI: the sends are fake requests that complete at their
``--tests``-th ``Test`` and the waiter tests without sleeping. It prints, measured in the same
run:

* ``versions``: the bookkeeping's microseconds per update;
* ``drain``: the bookkeeping before versions (append the send, ``Testall`` the block's sends
  before each update), the baseline;
* ``axpy``: the update's own arithmetic, ``w -= lr * g`` on the block (pserver's SGD updater),
  for each ``--block-mib``;

and the ratios versions / drain and versions / axpy: the share of an update the bookkeeping
costs. No thresholds: compare the ratios with an earlier commit's, printed by the same command.

Example::

    .venv/bin/python scripts/bench_versions.py --readers 3 --block-mib 2 16
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from benchlib import bench_parser, median, parse, table, write_json  # (scripts/ is on sys.path)


class FakeSend:
    """A send that completes at its ``tests``-th ``Test`` (an ``MPI.Request`` stand-in)."""

    __slots__ = ("left",)

    def __init__(self, tests: int) -> None:
        self.left = tests

    def Test(self) -> bool:  # noqa: N802 - MPI's name
        self.left -= 1
        return self.left <= 0


class SpinWaiter:
    """``Waiter.until`` without sleeping or liveness checks: the bookkeeping alone is timed."""

    def until(self, done: Callable[[], bool], what: Any, tight: float = 0.0) -> None:
        while not done():
            pass


def versions_loop(updates: int, readers: int, tests: int) -> float:
    """Seconds per update of ServedVersions' calls as a shard makes them (async, messages)."""
    from pserver.roles.shard_versions import ServedVersions

    w = np.zeros(16, np.float32)  # the arrays' size does not enter the bookkeeping
    v = ServedVersions(0, 1 + readers, [w], lambda i: np.empty_like(w), np)
    waiter = SpinWaiter()
    started = time.perf_counter()
    for _ in range(updates):
        v.new_version(waiter, w.nbytes)  # type: ignore[arg-type]
        if v.can_pin():  # the learner that pushed pulls the new weights
            v.pin_send(FakeSend(tests))  # type: ignore[arg-type]
    return (time.perf_counter() - started) / updates


def drain_loop(updates: int, tests: int) -> float:
    """Seconds per update of the bookkeeping before versions: drain every send, then write."""
    inflight: list[FakeSend] = []
    started = time.perf_counter()
    for _ in range(updates):
        while not all([r.Test() for r in inflight]):  # Testall
            pass
        inflight.clear()
        inflight.append(FakeSend(tests))
    return (time.perf_counter() - started) / updates


def axpy_seconds(mib: float, repeats: int) -> float:
    """Seconds of one SGD step ``w -= lr * g`` on a block of ``mib`` MiB (float32)."""
    import logging

    from pserver.optim.blas import limit_blas_threads
    from pserver.optim.rules import make_updater, preload
    from pserver.plan.config import OptimConfig

    n = int(mib * 2**20) // 4
    limit_blas_threads(0, logging.getLogger("bench_versions"))  # one thread, as a shard runs
    preload("sgd", np, np.dtype(np.float32))
    w, g = np.zeros(n, np.float32), np.zeros(n, np.float32)
    up = make_updater(OptimConfig(rule="sgd", lr=0.01, weight_decay=0.0), n, np, w.dtype)
    up.step(w, g, 0.01)  # first touch and imports outside the timing
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        up.step(w, g, 0.01)
        times.append(time.perf_counter() - t0)
    return median(times)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, repeats=5, pserver_run=False, overrides=False)
    p.add_argument("--readers", type=int, default=3, help="learners pulling the block")
    p.add_argument("--tests", type=int, default=2, help="Test calls until a fake send completes")
    p.add_argument("--updates", type=int, default=20000, help="updates per repeat")
    p.add_argument(
        "--block-mib", type=float, nargs="+", default=[2.0, 16.0],
        help="block sizes the update arithmetic is timed at",
    )  # fmt: skip
    args = parse(p, argv)
    if args.readers < 1 or args.tests < 1 or args.updates < 1:
        p.error("--readers, --tests and --updates need values >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    versions, drain = [], []
    for _ in range(args.repeats):  # interleaved, so a noisy moment hits both
        versions.append(versions_loop(args.updates, args.readers, args.tests))
        drain.append(drain_loop(args.updates, args.tests))
    v_us, d_us = median(versions) * 1e6, median(drain) * 1e6
    rows = [["versions (bookkeeping)", f"{v_us:.1f}", "1"],
            ["drain (before versions)", f"{d_us:.1f}", f"{v_us / d_us:.2f}"]]  # fmt: skip
    axpy = {}
    for mib in args.block_mib:
        axpy[mib] = axpy_seconds(mib, args.repeats * 4) * 1e6
        rows.append([f"axpy, {mib:g} MiB block", f"{axpy[mib]:.0f}", f"{v_us / axpy[mib]:.4f}"])
    title = (
        f"medians of {args.repeats} run(s), {args.readers} reader(s), sends complete at test "
        f"{args.tests}; versions/this = the bookkeeping's time over the row's"
    )
    print(table(["what", "us/update", "versions/this"], rows, title=title))
    write_json(args.json, {"argv": sys.argv, "versions_us": v_us, "drain_us": d_us,
                           "axpy_us": {f"{k:g}": x for k, x in axpy.items()}})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Where each rank's CPU goes during bench_pushpull's push/pull, per model update (``perf``).

Runs one configuration of ``scripts/bench_pushpull.py`` (1 shard, ``--learners`` learners, the
null model, async, ``--blocks`` blocks, ``--transport``) with every rank under ``perf record``
(CPU-clock samples, wall-clock timestamps), keeps the samples of the training window (from the
shard's first to its last sample in the update's BLAS kernel) and prints, per rank, the CPU
milliseconds per model update in each category below, and the rank's share of a core:

* ``copy (kernel)``: the kernel copying between processes (``process_vm_readv``: MPICH's
  single-copy path for large messages; the receiver of a payload makes it);
* ``memcpy``: libc's copies (``copyto``, a copy-on-write version, a window copy-out);
* ``update (BLAS)``: the SGD step;
* ``numpy``: numpy's own kernels (the null model's gradient fill, the gradient check's sum);
* ``Python``: the interpreter (the per-message bookkeeping of the protocol, versions, rows);
* ``MPI``: the MPI library and mpi4py (matching, progress, tests);
* ``kernel other``: scheduling, sleeps, page faults, system calls.

The rank roles come from the dump (its ``ranks`` attribute). Needs
``perf`` (``perf_event_paranoid`` ≤ 2 for one's own processes). Figures are CPU, not wall time:
on a loaded machine they are far steadier than rates. Example::

    python scripts/profile_pushpull.py --blocks 8 --transport messages
    python scripts/profile_pushpull.py --blocks 1 --transport shm --tree /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import h5py
from bench_pushpull import LR, PSERVER_TOML, digits_train_size  # (scripts/ is on sys.path)

CATEGORIES = (
    "copy (kernel)", "memcpy", "update (BLAS)", "numpy", "Python", "MPI", "kernel other", "other",
)  # fmt: skip
KERNEL_COPY = ("_copy_to_iter", "_copy_from_iter", "copy_user", "copy_page_to_iter")


def category(dso: str, sym: str) -> str:
    """The category of one sample (its shared object and symbol)."""
    if dso.startswith("[kernel"):
        return "copy (kernel)" if sym.startswith(KERNEL_COPY) else "kernel other"
    name = Path(dso).name
    if name.startswith("libc.") and ("memmove" in sym or "memcpy" in sym or "memset" in sym):
        return "memcpy"
    if "openblas" in name or "_fblas" in name:
        return "update (BLAS)"
    if "_multiarray" in name or "_umath" in name:
        return "numpy"
    if "python3" in name:
        return "Python"
    if "mpi" in name.lower() or name.startswith(("libucs", "libucp", "libuct", "libfabric")):
        return "MPI"
    return "other"


def samples(path: Path) -> list[tuple[float, str, str]]:
    """(time s, dso, symbol) of every sample of a perf data file."""
    out = subprocess.run(
        ["perf", "script", "-i", str(path), "-F", "time,ip,sym,dso"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = []
    for line in out.splitlines():
        # "  1764164100.123456:  7f1b4d21eb99 saxpy_k_SKYLAKEX (/path/lib.so)"
        head, _, rest = line.partition(":")
        try:
            t = float(head.strip())
        except ValueError:
            continue
        rest = rest.strip()
        dso = rest[rest.rfind("(") + 1 : -1] if rest.endswith(")") else "?"
        parts = rest[: rest.rfind("(")].split() if "(" in rest else rest.split()
        sym = parts[1] if len(parts) > 1 else "?"
        rows.append((t, dso, sym.split("+")[0]))
    return rows


def roles(dump: h5py.File) -> dict[int, str]:
    """rank -> role ("server 0", "learner 2", ...), from the dump's ``ranks`` attribute."""
    return {r["rank"]: r["role"] for r in json.loads(dump.attrs["ranks"])}


def run(args: argparse.Namespace, tmp: Path) -> tuple[dict[int, list], dict[int, str], int]:
    batch = max(1, round(digits_train_size() / args.updates))
    cfg = tmp / "run.toml"
    out = tmp / "out"
    cfg.write_text(
        PSERVER_TOML.format(
            out=out, epochs=1, lr=LR, size=args.size, batch=batch, blocks=args.blocks
        )
    )
    wrap = tmp / "wrap.sh"
    rank = "${PMI_RANK:-$OMPI_COMM_WORLD_RANK}"
    record = f"perf record -q -k CLOCK_REALTIME -F {args.freq} -o {tmp}/rank{rank}.data"
    wrap.write_text(f'#!/bin/bash\nexec {record} "$@"\n')
    wrap.chmod(0o755)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    n = 3 + args.learners
    cmd = [
        args.mpiexec, "-n", str(n), str(wrap), sys.executable, "-m", "pserver.job.cli", str(cfg),
        f"comm.transport={args.transport}", *args.set,
    ]  # fmt: skip
    res = subprocess.run(
        cmd, cwd=args.tree, env=env, capture_output=True, text=True, timeout=args.timeout
    )
    if res.returncode != 0:
        raise SystemExit(f"the run failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    with h5py.File(out / "stats.h5", "r", locking=False) as f:
        updates = int(f["servers"]["updates"][:].max())
        role = roles(f)
    data = {r: samples(tmp / f"rank{r}.data") for r in range(n)}
    return data, role, updates


def report(data: dict[int, list], role: dict[int, str], updates: int, freq: int) -> str:
    shard = next(r for r, name in role.items() if name.startswith("server"))
    blas = [t for t, d, s in data[shard] if category(d, s) == "update (BLAS)"]
    lo, hi = min(blas), max(blas)
    window = hi - lo
    lines = [
        f"training window {window:.2f} s (the shard's first to last update sample), "
        f"{updates} updates; CPU ms per update by category, and the share of a core",
        "rank  role          " + "  ".join(f"{c:>13}" for c in CATEGORIES) + "    total   core",
    ]
    totals: Counter = Counter()
    for r in sorted(data):
        counts = Counter(category(d, s) for t, d, s in data[r] if lo <= t <= hi)
        ms = {c: counts[c] / freq * 1e3 / updates for c in CATEGORIES}
        total = sum(ms.values())
        totals.update(ms)
        share = sum(counts.values()) / freq / window
        lines.append(
            f"{r:>4}  {role.get(r, '?'):<12}  " + "  ".join(f"{ms[c]:>13.2f}" for c in CATEGORIES)
            + f"  {total:>7.2f}  {share:>5.0%}"
        )  # fmt: skip
    lines.append(
        "all                 " + "  ".join(f"{totals[c]:>13.2f}" for c in CATEGORIES)
        + f"  {sum(totals.values()):>7.2f}"
    )  # fmt: skip
    return "\n".join(lines)


def top(data: dict[int, list], rank: int, k: int) -> str:
    """The ``k`` symbols with the most samples of one rank (to see inside a category)."""
    by = defaultdict(int)
    for _, d, s in data[rank]:
        by[(category(d, s), s)] += 1
    total = sum(by.values())
    rows = sorted(by.items(), key=lambda kv: -kv[1])[:k]
    return "\n".join(f"  {n / total:6.1%}  {c:<14} {s}" for (c, s), n in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--transport", choices=["messages", "shm"], default="messages")
    p.add_argument("--size", type=float, default=16.0, help="model MiB")
    p.add_argument("--learners", type=int, default=3)
    p.add_argument("--updates", type=int, default=400, help="about this many updates")
    p.add_argument("--freq", type=int, default=999, help="perf samples per CPU second")
    p.add_argument("--tree", default=".", help="the checkout to run (its pserver is imported)")
    p.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--top", type=int, default=0, help="also the top symbols of each rank")
    p.add_argument("--set", nargs="*", default=[], help="more pserver-run overrides")
    args = p.parse_args(argv)
    if shutil.which("perf") is None:
        print("perf is not installed: nothing measured")
        return 0
    with tempfile.TemporaryDirectory(prefix="profile_pushpull_") as tmp:
        data, role, updates = run(args, Path(tmp))
    print(report(data, role, updates, args.freq))
    for r in sorted(data) if args.top else ():
        print(f"rank {r} ({role.get(r, '?')}), whole run:\n{top(data, r, args.top)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

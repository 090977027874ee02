#!/usr/bin/env python3
"""GPU paths of pserver against baselines measured in the same run, on one CUDA device.

(a) **Server updates.** ``pserver.optim.rules.make_updater`` on CuPy (one fused kernel per step) for
    sgd, momentum, nesterov and adagrad on blocks of 1, 16 and 64 MiB, against a device-to-device
    ``cupy.copyto`` of the same block. Both are rated by the bytes they move through device
    memory: an update reads w and g (and the state) and writes w (and the state), so
    ``3 * block`` for sgd and ``5 * block`` for the others; a copy reads and writes one block,
    ``2 * block``. The ratio ``update GB/s / copy GB/s`` says how close a step comes to the
    memory bandwidth a copy achieves (1.0 = as fast as memory allows).
(b) **Host staging.** ``pserver.comm.backend.StagingBuffers`` (pinned mirrors, a dedicated copy
    stream) device-to-host and host-to-device, against ``cupy.asnumpy``/``cupy.asarray`` of the
    same size (pageable memory, a fresh allocation per call: what naive code does) and against a
    raw ``cudaMemcpy`` to or from the same pinned buffer (the PCIe/NVLink ceiling).
(c) **Learner compute.** Forward + backward of one minibatch (``Model.loss_grad``, which returns
    the loss as a Python float, so a device sync is included, as in a learner) on numpy and on
    CuPy, for the quickstart MLP, a wider MLP and the CNN.

Timings: warm-up runs first (kernel compilation, memory pools), then the median of ``--repeat``
runs; GPU work is timed with ``cupy.cuda.Event`` pairs, numpy work with ``time.perf_counter``.
Nothing is asserted: the printed ratios are the result. Without CuPy or a device the script says
"no GPU: skipped" and exits 0, so it can run anywhere.

Example::

    python scripts/bench_gpu.py --sizes-mib 1 16 64 --repeat 20
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from benchlib import bench_parser, median, parse, table  # (scripts/ is on sys.path)

MIB = 2**20
RULES = ("sgd", "momentum", "nesterov", "adagrad")
# Device-memory traffic of one step, in blocks: reads of w, g, state + writes of w, state.
BLOCKS_MOVED = {"sgd": 3, "momentum": 5, "nesterov": 5, "adagrad": 5}
LR = 1e-3

# (label, model.kind, hidden or channels, batch): the quickstart MLP, a wider one, the CNN.
MODELS: tuple[tuple[str, str, list[int], int], ...] = (
    ("mlp [64], quickstart", "mlp", [64], 16),
    ("mlp [1024, 1024]", "mlp", [1024, 1024], 256),
    ("cnn [32, 64]", "cnn", [32, 64], 16),
    ("cnn [32, 64]", "cnn", [32, 64], 256),
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser(
        "Throughput of pserver's GPU paths against raw CuPy baselines (one device).",
        repeats=20, pserver_run=False, overrides=False, json_out=False,
        epilog='without CuPy or a CUDA device: prints "no GPU: skipped" and exits 0',
    )  # fmt: skip
    p.prog = "bench_gpu.py"
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64],
                   help="block sizes for (a) and (b), MiB (default: 1 16 64)")  # fmt: skip
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before timing")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--device", type=int, default=0, help="CUDA device id (default 0)")
    p.add_argument("--skip", nargs="*", choices=("updates", "staging", "models"), default=[],
                   help="parts to leave out")  # fmt: skip
    args = parse(p, argv)
    if args.warmup < 0 or any(s <= 0 for s in args.sizes_mib):
        p.error("--warmup must be >= 0 and every size > 0")
    return args


def find_gpu(device: int) -> tuple[ModuleType | None, str]:
    """CuPy with ``device`` made current, or None and why not."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install failing inside the import
        return None, f"CuPy cannot be imported ({e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver or no device
        return None, f"CuPy finds no usable CUDA device ({e})"
    if not 0 <= device < n:
        return None, f"device {device} requested, {n} visible"
    cupy.cuda.Device(device).use()
    return cupy, ""


# -- timing -----------------------------------------------------------------------------------


def gpu_median(cp: ModuleType, fn: Callable[[], Any], warmup: int, repeat: int) -> float:
    """Median seconds of ``fn`` between two events on the current stream."""
    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)  # ms -> s
    return median(times)


def cpu_median(fn: Callable[[], Any], warmup: int, repeat: int) -> float:
    """Median wall-clock seconds of ``fn`` (host work)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return median(times)


def print_table(title: str, header: Sequence[str], rows: list[Sequence[str]]) -> None:
    text = table(header, rows)
    print(f"\n{title}\n{text.splitlines()[1]}\n{text}")  # a rule above the header too


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


# -- (a) server updates -----------------------------------------------------------------------


def bench_updates(cp: ModuleType, args: argparse.Namespace) -> None:
    itemsize = np.dtype(args.dtype).itemsize
    rows = []
    for mib in args.sizes_mib:
        n = int(mib * MIB) // itemsize
        t_copy = time_copy(cp, args, n)
        copy_rate = gbps(2 * n * itemsize, t_copy)
        rows.append((f"{mib:g}", "copyto", f"{t_copy * 1e6:.1f}", f"{copy_rate:.1f}", "1.00"))
        for rule in RULES:
            t = time_update(cp, args, rule, n)
            rate = gbps(BLOCKS_MOVED[rule] * n * itemsize, t)
            rows.append(
                (f"{mib:g}", rule, f"{t * 1e6:.1f}", f"{rate:.1f}", f"{rate / copy_rate:.2f}")
            )
        cp.get_default_memory_pool().free_all_blocks()
    print_table(
        f"(a) server update throughput on the device ({args.dtype}; bytes = reads + writes)",
        ("MiB", "op", "us/step", "GB/s", "vs copyto"),
        rows,
    )


def time_copy(cp: ModuleType, args: argparse.Namespace, n: int) -> float:
    """Median seconds of a device-to-device copy of ``n`` elements (the bandwidth baseline)."""
    src, dst = cp.ones(n, dtype=args.dtype), cp.empty(n, dtype=args.dtype)
    return gpu_median(cp, lambda: cp.copyto(dst, src), args.warmup, args.repeats)


def time_update(cp: ModuleType, args: argparse.Namespace, rule: str, n: int) -> float:
    """Median seconds of one server update step of ``rule`` on a block of ``n`` elements."""
    from pserver.optim.rules import make_updater
    from pserver.plan.config import OptimConfig

    cfg = OptimConfig(rule=rule, momentum=0.9, weight_decay=1e-4)
    updater = make_updater(cfg, n, cp, args.dtype)
    w, g = cp.zeros(n, dtype=args.dtype), cp.full(n, 1e-3, dtype=args.dtype)
    return gpu_median(cp, lambda: updater.step(w, g, LR), args.warmup, args.repeats)


# -- (b) host staging -------------------------------------------------------------------------


def bench_staging(cp: ModuleType, args: argparse.Namespace) -> None:
    from pserver.comm.backend import Backend, StagingBuffers

    backend = Backend(name="gpu", xp=cp, device_id=args.device, cuda_aware=False)
    rows = []
    for mib in args.sizes_mib:
        n = int(mib * MIB) // np.dtype(args.dtype).itemsize
        staging = StagingBuffers(backend, [n], args.dtype)
        dev = cp.ones(n, dtype=args.dtype)
        for direction, paths in staging_paths(cp, staging, dev).items():
            rows += staging_rows(cp, args, mib, dev.nbytes, direction, paths)
        del staging, dev
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
    print_table(
        "(b) host <-> device staging (ratio: StagingBuffers GB/s / the row's GB/s)",
        ("MiB", "dir", "path", "ms", "GB/s", "staging / this"),
        rows,
    )


def staging_paths(cp: ModuleType, staging: Any, dev: Any) -> dict[str, dict[str, Callable]]:
    """Per direction, the three ways of moving ``dev`` across the bus that are compared."""
    from pserver.comm.backend import D2H, H2D

    pinned = staging.host(0)  # the staging buffer itself: the raw copy's ceiling, same memory
    pageable = np.ones(dev.size, dtype=dev.dtype)
    nbytes = dev.nbytes

    def d2h_raw() -> None:
        cp.cuda.runtime.memcpy(pinned.ctypes.data, dev.data.ptr, nbytes, D2H)

    def h2d_raw() -> None:
        cp.cuda.runtime.memcpy(dev.data.ptr, pinned.ctypes.data, nbytes, H2D)

    return {
        "D2H": {
            "StagingBuffers": lambda: staging.to_host(0, dev),
            "cupy.asnumpy": lambda: cp.asnumpy(dev),
            "memcpy pinned": d2h_raw,
        },
        "H2D": {
            "StagingBuffers": lambda: staging.from_host(0, dev),
            "cupy.asarray": lambda: cp.asarray(pageable),
            "memcpy pinned": h2d_raw,
        },
    }




def staging_rows(
    cp: ModuleType,
    args: argparse.Namespace,
    mib: float,
    nbytes: int,
    direction: str,
    paths: dict[str, Callable],
) -> list[tuple[str, ...]]:
    """One table row per path, each rated against the StagingBuffers path."""
    times = {name: gpu_median(cp, fn, args.warmup, args.repeats) for name, fn in paths.items()}
    ours = gbps(nbytes, times["StagingBuffers"])
    rows = []
    for name, t in times.items():
        rate = gbps(nbytes, t)
        rows.append(
            (f"{mib:g}", direction, name, f"{t * 1e3:.3f}", f"{rate:.2f}", f"{ours / rate:.2f}")
        )
    return rows


# -- (c) learner compute ----------------------------------------------------------------------


def bench_models(cp: ModuleType, args: argparse.Namespace) -> None:
    rows = []
    for label, kind, sizes, batch in MODELS:
        n_params, t_np, t_cp = time_model(cp, args, kind, sizes, batch)
        rows.append(
            (
                label,
                str(batch),
                str(n_params),
                f"{t_np * 1e3:.3f}",
                f"{t_cp * 1e3:.3f}",
                f"{t_np / t_cp:.2f}",
            )
        )
    print_table(
        f"(c) forward + backward of one minibatch ({args.dtype}; speed-up = numpy / CuPy)",
        ("model", "batch", "params", "numpy ms", "cupy ms", "speed-up"),
        rows,
    )


def time_model(
    cp: ModuleType, args: argparse.Namespace, kind: str, sizes: list[int], batch: int
) -> tuple[int, float, float]:
    """Parameter count and median ``loss_grad`` seconds on numpy and on CuPy, same inputs."""
    from learners.cnn import build_cnn
    from learners.models import build_model
    from pserver.plan.config import ModelConfig

    n_features, n_classes = 64, 10  # the digits: 8 x 8 pixels, 10 classes
    cfg = ModelConfig(kind=kind, hidden=sizes if kind == "mlp" else [64], dtype=args.dtype)
    build = build_model
    if kind == "cnn":
        cfg.channels = sizes  # works whether or not ModelConfig declares the field yet
        build = build_cnn
    host, dev = build(cfg, n_features, n_classes, np), build(cfg, n_features, n_classes, cp)
    rng = np.random.default_rng(0)
    w = host.init_params(0)
    X = rng.random((batch, n_features), dtype=np.float32)
    y = rng.integers(0, n_classes, size=batch)
    g = np.empty_like(w)
    w_d, X_d, y_d, g_d = cp.asarray(w), cp.asarray(X), cp.asarray(y), cp.empty_like(w)
    t_np = cpu_median(lambda: host.loss_grad(w, X, y, g), args.warmup, args.repeats)
    t_cp = gpu_median(cp, lambda: dev.loss_grad(w_d, X_d, y_d, g_d), args.warmup, args.repeats)
    return host.n_params, t_np, t_cp


# -- main -------------------------------------------------------------------------------------


def describe(cp: ModuleType, device: int) -> str:
    props = cp.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    runtime = cp.cuda.runtime.runtimeGetVersion()
    return (
        f"device {device}: {name}, {props['totalGlobalMem'] / 2**30:.1f} GiB; CuPy "
        f"{cp.__version__}, CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}; "
        f"numpy {np.__version__}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cp, why = find_gpu(args.device)
    if cp is None:
        print(f"no GPU: skipped ({why})")
        return 0
    print(describe(cp, args.device))
    parts = {"updates": bench_updates, "staging": bench_staging, "models": bench_models}
    for name, bench in parts.items():
        if name not in args.skip:
            bench(cp, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

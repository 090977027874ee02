#!/usr/bin/env python3
"""Push/pull throughput of pserver against raw MPI and a naive pickling parameter server.

One server and 1-4 learners with zero compute (``model.kind=null``) push gradients and pull
weights of a 1, 16 or 64 MiB model, cut into ``blocks.count`` messages, under the async protocol
(one SGD update per gradient). In the same run the script measures, for the same sizes:

* raw one-way bandwidth of uppercase ``Send``/``Recv`` between two ranks (a ping answered by a
  tiny ack, repeated; median of the iterations);
* a naive parameter server that pickles the arrays (lowercase ``send``/``recv``, what many
  research codes do): rank 0 receives a gradient from any learner, applies ``w -= lr * g`` and
  sends the pickled weights back.

Both parameter servers are rated by their payload rate at the server:
``(bytes received + bytes sent) / time`` between the 10th and the last update, so start-up and
shut-down do not count. The server receives and sends one after the other through a single
process, so its total payload rate against the *one-way* raw rate says which fraction of the time
the server keeps the link busy with payload (1.0 = a perfect two-sided server).

This file is both the driver (default) and the MPI programs it launches (``--raw``, ``--naive``).
Every launch runs under a timeout; each configuration is repeated and the median reported.

Example::

    .venv/bin/python scripts/bench_pushpull.py --sizes 16 --learners 1 --blocks 1 4 8 \\
        --repeats 3 --json /tmp/pushpull.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (  # (scripts/ is on sys.path)
    RESULT,
    Launcher,
    bench_parser,
    gpu_missing,
    idle_summary,
    median,
    parse,
    pserver_run,
    table,
    write_json,
)

MIB = 2**20
SKIP = 10  # updates before the timing window opens (the window runs from the 10th to the last)
LR = 0.01


# -- MPI programs (run under mpiexec) -------------------------------------------------------------


def size_key(mib: float) -> str:
    """The key of a message size in the raw results (the same for 16, 16.0 and "16")."""
    return f"{float(mib):g}"


def reps_for(nbytes: int, seconds: float) -> int:
    """Iterations that take about ``seconds`` at ~10 GB/s, between 20 and 2000."""
    return max(20, min(2000, int(seconds * 10e9 / max(nbytes, 1))))


def raw_worker(sizes_mib: list[float], seconds: float) -> None:
    """Rank 0 pings rank 1 with each size and waits for a 1-element ack; median one-way GB/s.

    Both the uppercase buffer path (``Send``/``Recv``) and the pickled path (``send``/``recv`` of a
    numpy array) are timed, for orientation.
    """
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("--raw needs exactly 2 ranks")
    rank, ack = comm.Get_rank(), np.zeros(1, np.int64)
    out: dict[str, dict[str, float]] = {"raw": {}, "pickled": {}}
    for mib in sizes_mib:
        buf = np.ones(int(mib * MIB) // 4, np.float32)
        n = reps_for(buf.nbytes, seconds)
        for kind in ("raw", "pickled"):
            times = []
            comm.Barrier()
            for i in range(n + 3):
                t0 = MPI.Wtime()
                if rank == 0:
                    comm.Send(buf, 1, 0) if kind == "raw" else comm.send(buf, 1, 0)
                    comm.Recv(ack, 1, 1)
                else:
                    if kind == "raw":
                        comm.Recv(buf, 0, 0)
                    else:
                        comm.recv(source=0, tag=0)
                    comm.Send(ack, 0, 1)
                if i >= 3:  # warm-up iterations excluded
                    times.append(MPI.Wtime() - t0)
            if kind == "pickled" and n > 100:
                n = n // 4  # the pickled path is ~10x slower: keep its share of the run small
            out[kind][size_key(mib)] = buf.nbytes / median(times) / 1e9
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)


def raw_gpu_worker(sizes_mib: list[float], seconds: float) -> None:
    """The hand-written ways of moving a CUDA device buffer from rank 0 to rank 1, one-way GB/s.

    * ``host``: ``Send``/``Recv`` between pinned host buffers (the link alone);
    * ``staged``: device-to-host copy into a pinned buffer, ``Send`` -> ``Recv``, host-to-device
      copy on the receiver: what a learner and a server do when MPI is not CUDA-aware;
    * ``device``: ``Send``/``Recv`` of the device buffers themselves, only where the library is
      CUDA-aware (:func:`pserver.comm.backend.detect_cuda_aware`); handing a device buffer to a
      library that is not crashes it (seen with MPICH 5.0 and Open MPI 4.1 built without CUDA).
    """
    import cupy as cp
    import cupyx
    import numpy as np
    from mpi4py import MPI

    from pserver.comm.backend import D2H, H2D, detect_cuda_aware

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("--raw-gpu needs exactly 2 ranks")
    rank, ack = comm.Get_rank(), np.zeros(1, np.int64)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    cp.cuda.Device(local % cp.cuda.runtime.getDeviceCount()).use()
    aware = detect_cuda_aware(MPI)
    kinds = ["host", "staged", *(["device"] if aware else [])]
    out: dict[str, Any] = {k: {} for k in kinds}
    out["cuda_aware"] = aware
    for mib in sizes_mib:
        n = int(mib * MIB) // 4
        dev = cp.ones(n, np.float32)
        pinned = cupyx.empty_pinned((n,), np.float32)
        cp.cuda.Device().synchronize()
        host_ptr, dev_ptr, nbytes = pinned.ctypes.data, dev.data.ptr, pinned.nbytes
        reps = reps_for(pinned.nbytes, seconds)
        for kind in kinds:
            buf = dev if kind == "device" else pinned
            times = []
            comm.Barrier()
            for i in range(reps + 3):
                t0 = MPI.Wtime()
                if rank == 0:
                    if kind == "staged":
                        cp.cuda.runtime.memcpy(host_ptr, dev_ptr, nbytes, D2H)
                    comm.Send(buf, 1, 0)
                    comm.Recv(ack, 1, 1)
                else:
                    comm.Recv(buf, 0, 0)
                    if kind == "staged":
                        cp.cuda.runtime.memcpy(dev_ptr, host_ptr, nbytes, H2D)
                    comm.Send(ack, 0, 1)
                if i >= 3:
                    times.append(MPI.Wtime() - t0)
            out[kind][size_key(mib)] = nbytes / median(times) / 1e9
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)


def naive_worker(size_mib: float, steps: int, buffers: bool = False) -> None:
    """A parameter server as research codes often write it: blocking calls, one array per message.

    Rank 0 performs ``steps`` updates: receive a gradient from any learner, ``w -= lr*g``, send
    the weights back to that learner. Learner ``i`` pushes and pulls its share. With
    ``buffers=False`` the arrays are pickled (lowercase ``send``/``recv``); with ``buffers=True``
    it is the hand-written loop an MPI programmer would write instead: uppercase ``Send``/``Recv``
    into preallocated buffers and pserver's own SGD updater (the same arithmetic), with MPICH's
    busy-polling blocking calls. That loop has no protocol, statistics or waiting discipline: it
    is the ceiling of a two-sided server on this machine.
    """
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n_learners = comm.Get_rank(), comm.Get_size() - 1
    n = int(size_mib * MIB) // 4
    comm.Barrier()
    if rank == 0:
        w, status, times = np.zeros(n, np.float32), MPI.Status(), []
        if buffers:
            from pserver.optim.rules import make_updater
            from pserver.plan.config import OptimConfig

            g = np.empty_like(w)
            updater = make_updater(OptimConfig(rule="sgd", lr=LR, weight_decay=0.0), n, np, w.dtype)
        t0 = time.perf_counter()
        for _ in range(steps):
            # wildcard receives through matched probes, as in pserver (docs/architecture.md)
            msg = comm.mprobe(MPI.ANY_SOURCE, 0, status)
            if buffers:
                msg.Recv(g)
                updater.step(w, g, LR)
                comm.Send(w, dest=status.Get_source(), tag=1)
            else:
                g = msg.recv()
                w -= LR * g
                comm.send(w, dest=status.Get_source(), tag=1)
            times.append(time.perf_counter() - t0)
        print(RESULT + json.dumps({"times": times, "bytes_per_update": 2 * w.nbytes}), flush=True)
    else:
        g = np.full(n, 1e-3, np.float32)
        mine = steps // n_learners + (rank - 1 < steps % n_learners)
        for _ in range(mine):
            if buffers:
                comm.Send(g, dest=0, tag=0)
                comm.Recv(g, source=0, tag=1)
            else:
                comm.send(g, dest=0, tag=0)
                comm.recv(source=0, tag=1)


def replay_worker(size_mib: float, steps: int, zero_copy: bool) -> None:
    """The memory limit of a two-sided server: only its memory work, on every core, no MPI.

    Each rank (one per core) replays ``steps`` updates of a ``size_mib`` model: copy the
    learner's gradient into the server's receive buffer (what a receive does; left out with
    ``zero_copy``: the update reads the gradient where the learner wrote it, as with the
    shared window), one pass of pserver's SGD updater over w, and the learner's copy of the new
    weights out of the server's buffer (what a send and receive, or a window copy-out, do).
    Every payload byte a pserver update counts (gradient in, weights out) is thus moved the
    fewest times any implementation can move it. The rate is the sum of the ranks' payload
    rates (each between its update number ``SKIP`` and its last); MPI only starts the ranks
    together and gathers the figures.
    """
    import numpy as np
    from mpi4py import MPI

    from pserver.optim.rules import make_updater
    from pserver.plan.config import OptimConfig

    comm = MPI.COMM_WORLD
    n = int(size_mib * MIB) // 4
    w, g_learner = np.zeros(n, np.float32), np.full(n, 1e-3, np.float32)
    g_server, w_learner = np.empty_like(w), np.empty_like(w)
    updater = make_updater(OptimConfig(rule="sgd", lr=LR, weight_decay=0.0), n, np, w.dtype)
    comm.Barrier()
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        if zero_copy:
            updater.step(w, g_learner, LR)
        else:
            np.copyto(g_server, g_learner)
            updater.step(w, g_server, LR)
        np.copyto(w_learner, w)
        times.append(time.perf_counter() - t0)
    rates = comm.gather(window_rate(times, 2 * w.nbytes), 0)
    if comm.Get_rank() == 0:
        print(RESULT + json.dumps({"gbs": sum(rates), "ranks": len(rates)}), flush=True)


def replay_gpu_worker(size_mib: float, steps: int) -> None:
    """The device-to-host copy limit of a staged server: its copies and its update, no MPI.

    One process on the GPU replays ``steps`` updates of a ``size_mib`` model: the gradient
    copied from a pinned host buffer into the device (what a staged receive does after MPI has
    filled the pinned mirror), one pass of pserver's SGD kernel over w on the device, and the
    new weights copied back into a pinned host buffer (what a staged send does before MPI
    reads it). Both copies go through the same host link the staged path uses, one after the
    other, so this is the payload rate of a server that does nothing but its copies and its
    update; MPI only starts the rank and the figure is printed as the CPU replay's is.
    """
    import cupy as cp
    import cupyx
    import numpy as np
    from mpi4py import MPI

    from pserver.comm.backend import D2H, H2D
    from pserver.optim.rules import make_updater
    from pserver.plan.config import OptimConfig

    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    cp.cuda.Device(local % cp.cuda.runtime.getDeviceCount()).use()
    n = int(size_mib * MIB) // 4
    w, g = cp.zeros(n, np.float32), cp.empty(n, np.float32)
    g_host = cupyx.empty_pinned((n,), np.float32)
    w_host = cupyx.empty_pinned((n,), np.float32)
    g_host[:] = 1e-3
    updater = make_updater(OptimConfig(rule="sgd", lr=LR, weight_decay=0.0), n, cp, w.dtype)
    stream = cp.cuda.get_current_stream()
    nbytes = w.nbytes
    comm.Barrier()
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        cp.cuda.runtime.memcpy(g.data.ptr, g_host.ctypes.data, nbytes, H2D)
        updater.step(w, g, LR)
        stream.synchronize()
        cp.cuda.runtime.memcpy(w_host.ctypes.data, w.data.ptr, nbytes, D2H)
        times.append(time.perf_counter() - t0)
    rates = comm.gather(window_rate(times, 2 * nbytes), 0)
    if comm.Get_rank() == 0:
        print(RESULT + json.dumps({"gbs": sum(rates), "ranks": len(rates)}), flush=True)


# -- driver ---------------------------------------------------------------------------------------


@dataclass
class Row:
    """One configuration's medians over the repeats, and every repeat's value."""

    size_mib: float
    learners: int
    blocks: int
    steps: int
    transport: str = "messages"  # comm.transport of the pserver runs
    raw_gbs: float = math.nan
    raw_block_gbs: float = math.nan  # raw one-way at the block (message) size, for reference
    pickled_gbs: float = math.nan  # pickled one-way, 2 ranks
    naive_gbs: float = math.nan
    buffer_gbs: float = math.nan  # the hand-written uppercase loop (the two-sided ceiling)
    limit_gbs: float = math.nan  # the memory work alone on every core (``replay_worker``)
    pserver_gbs: float = math.nan
    pserver_updates_per_s: float = math.nan
    naive_runs: list[float] = field(default_factory=list)
    buffer_runs: list[float] = field(default_factory=list)
    limit_runs: list[float] = field(default_factory=list)
    pserver_runs: list[float] = field(default_factory=list)

    @property
    def vs_raw(self) -> float:
        return self.pserver_gbs / self.raw_gbs

    @property
    def vs_naive(self) -> float:
        return self.pserver_gbs / self.naive_gbs

    @property
    def vs_buffer(self) -> float:
        return self.pserver_gbs / self.buffer_gbs

    @property
    def vs_limit(self) -> float:
        return self.pserver_gbs / self.limit_gbs

    @property
    def replay(self) -> str:
        """The limit replay this row is rated against: the shared window reads the gradients
        in place (zero copy in), messages copy them in; the learner copies the weights out."""
        return "zero" if self.transport == "shm" else "copy"


def window_rate(times: list[float], bytes_per_update: float) -> float:
    """Payload GB/s between update number ``SKIP`` and the last one."""
    if len(times) < SKIP + 5:
        raise RuntimeError(f"only {len(times)} updates: too few to time; raise --traffic-gib")
    t = sorted(times)
    return bytes_per_update * (len(t) - SKIP) / (t[-1] - t[SKIP - 1]) / 1e9


def steps_for(size_mib: float, traffic_gib: float, min_steps: int, max_steps: int) -> int:
    """Updates per run: about ``traffic_gib`` of server payload, within the bounds."""
    return max(min_steps, min(max_steps, round(traffic_gib * 1024 / (2 * size_mib))))


def digits_train_size() -> int:
    from learners.data import load_dataset
    from pserver.plan.config import DataConfig

    return len(load_dataset(DataConfig(), 0).y_train)


PSERVER_TOML = """\
[run]
name = "bench_pushpull"
out_dir = "{out}"
epochs = {epochs}
overwrite = true
log_level = "warning"

[protocol]
name = "async"

[optim]
rule = "sgd"
lr = {lr}
weight_decay = 0.0

[model]
kind = "null"
size_mib = {size}

[data]
source = "digits"
batch_size = {batch}

[blocks]
count = {blocks}

[stats]
progress = false
test_every = 1000000
"""


class PserverBench:
    """Writes a config for each case, runs pserver-run, and rates the dump."""

    def __init__(
        self, launcher: Launcher, pserver_run: list[str], train_size: int, tmp: Path
    ) -> None:
        self.launcher, self.pserver_run = launcher, pserver_run
        self.train_size, self.tmp = train_size, tmp

    def config(self, size: float, blocks: int, steps: int, extra: list[str]) -> list[str]:
        """Arguments of pserver-run for ~``steps`` updates (batch size and epochs chosen)."""
        if steps <= self.train_size:
            epochs, batch = 1, max(1, round(self.train_size / steps))
        else:
            epochs, batch = math.ceil(steps / self.train_size), 1
        out = self.tmp / f"ps_{size}_{blocks}"
        path = self.tmp / f"ps_{size}_{blocks}.toml"
        path.write_text(
            PSERVER_TOML.format(
                out=out, epochs=epochs, lr=LR, size=size, batch=batch, blocks=blocks
            )
        )
        return [*self.pserver_run, str(path), *extra]

    def run(self, size: float, learners: int, blocks: int, steps: int, extra: list[str]) -> tuple:
        """(payload GB/s at the server, updates/s) of one pserver run."""
        args = self.config(size, blocks, steps, extra)
        self.launcher.run(3 + learners, args)
        out = self.tmp / f"ps_{size}_{blocks}"
        return rate_from_dump(out / "stats.h5")


def rate_from_dump(path: Path) -> tuple[float, float]:
    """(payload GB/s, updates/s) between the 10th and the last update of shard 0."""
    import h5py
    import numpy as np

    with h5py.File(path, "r", locking=False) as f:
        s = f["servers"]
        total = float(np.sum(s["bytes_in"][:]) + np.sum(s["bytes_out"][:]))
        n_updates = float(np.sum(s["updates"][:]))
        times = f["updates/time"][:][f["updates/shard"][:] == 0]
    per_update = total / n_updates
    gbs = window_rate(list(times), per_update)
    return gbs, gbs * 1e9 / per_update


def raw_key(row: Row) -> str:
    """The raw measurement a row is rated against: the hand-written path that moves the same
    buffers (host Send/Recv on CPU; staged or device-buffer Send/Recv on GPU)."""
    return {"staged": "staged", "cuda-aware": "device"}.get(row.transport, "raw")


def pserver_overrides(row: Row, device: str) -> list[str]:
    if device == "gpu":
        aware = "yes" if row.transport == "cuda-aware" else "no"
        return ["run.device=gpu", f"comm.cuda_aware={aware}", "comm.transport=messages"]
    return [f"comm.transport={row.transport}"]


def measure(args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    """Every configuration ``args.repeats`` times, interleaved; medians per configuration."""
    launcher = Launcher.from_args(__file__, args)
    gpu = args.device == "gpu"
    rows = [
        Row(s, n, b, steps_for(s, args.traffic_gib, args.min_steps, args.max_steps), t)
        for s in args.sizes
        for n in args.learners
        for b in args.blocks
        for t in (args.gpu_paths if gpu else args.transports)
    ]
    msg_sizes = sorted({r.size_mib for r in rows} | {r.size_mib / r.blocks for r in rows})
    raw_runs: list[dict[str, Any]] = []
    ps_runs: dict[int, list[tuple[float, float]]] = {}
    naive_done: dict[tuple[float, int], list[float]] = {}
    buffer_done: dict[tuple[float, int], list[float]] = {}
    limit_done: dict[tuple[float, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_pushpull_") as tmp:
        bench = PserverBench(launcher, pserver_run(args), digits_train_size(), Path(tmp))
        for rep in range(args.repeats):
            log(f"repeat {rep + 1}/{args.repeats}: raw Send/Recv at {msg_sizes} MiB")
            raw_mode = "--raw-gpu" if gpu else "--raw"
            raw_runs.append(launcher.worker(2, [raw_mode, *map(str, msg_sizes)]))
            if gpu and not raw_runs[0]["cuda_aware"] and rep == 0:
                if any(r.transport == "cuda-aware" for r in rows):
                    log("  the MPI library is not CUDA-aware: only the staged path is measured")
                rows = [r for r in rows if r.transport != "cuda-aware"]
            for i, r in enumerate(rows):
                key = (r.size_mib, r.learners)
                if len(naive_done.setdefault(key, [])) <= rep and not (args.no_naive or gpu):
                    log(f"  naive pickle PS: {r.size_mib} MiB, {r.learners} learner(s)")
                    res = launcher.worker(
                        1 + r.learners, ["--naive", str(r.size_mib), "--steps", str(r.steps)]
                    )
                    naive_done[key].append(window_rate(res["times"], res["bytes_per_update"]))
                if len(buffer_done.setdefault(key, [])) <= rep and not gpu:
                    log(f"  hand-written buffer PS: {r.size_mib} MiB, {r.learners} learner(s)")
                    res = launcher.worker(
                        1 + r.learners,
                        ["--naive", str(r.size_mib), "--buffers", "--steps", str(r.steps)],
                    )
                    buffer_done[key].append(window_rate(res["times"], res["bytes_per_update"]))
                lkey = (r.size_mib, r.replay)
                if len(limit_done.setdefault(lkey, [])) <= rep and gpu:
                    log(f"  limit replay (H2D copy in, SGD kernel, D2H copy out): {r.size_mib} MiB")
                    res = launcher.worker(
                        1, ["--replay-gpu", str(r.size_mib), "--steps", str(r.steps)]
                    )
                    limit_done[lkey].append(res["gbs"])
                elif len(limit_done[lkey]) <= rep:
                    log(f"  limit replay ({r.replay} in, copy out): {r.size_mib} MiB")
                    mode = ["--zero-copy"] if r.replay == "zero" else []
                    res = launcher.worker(
                        args.replay_ranks,
                        ["--replay", str(r.size_mib), "--steps", str(r.steps), *mode],
                    )
                    limit_done[lkey].append(res["gbs"])
                log(
                    f"  pserver: {r.size_mib} MiB, {r.learners} learner(s), {r.blocks} block(s), "
                    f"{r.transport}"
                )
                extra = [*args.set, *pserver_overrides(r, args.device)]
                run = bench.run(r.size_mib, r.learners, r.blocks, r.steps, extra)
                ps_runs.setdefault(i, []).append(run)
    for i, r in enumerate(rows):
        k = raw_key(r)
        r.raw_gbs = median(x[k][size_key(r.size_mib)] for x in raw_runs)
        r.raw_block_gbs = median(x[k][size_key(r.size_mib / r.blocks)] for x in raw_runs)
        if not gpu:
            r.pickled_gbs = median(x["pickled"][size_key(r.size_mib)] for x in raw_runs)
        r.naive_runs = naive_done.get((r.size_mib, r.learners), [])
        r.naive_gbs = median(r.naive_runs) if r.naive_runs else math.nan
        r.buffer_runs = buffer_done.get((r.size_mib, r.learners), [])
        r.buffer_gbs = median(r.buffer_runs) if r.buffer_runs else math.nan
        r.limit_runs = limit_done.get((r.size_mib, r.replay), [])
        r.limit_gbs = median(r.limit_runs) if r.limit_runs else math.nan
        r.pserver_runs = [g for g, _ in ps_runs[i]]
        r.pserver_gbs = median(r.pserver_runs)
        r.pserver_updates_per_s = median(u for _, u in ps_runs[i])
    extra: dict[str, Any] = {"raw_runs": raw_runs, "idle_before_launches": launcher.idle_seen}
    if gpu:
        link = {k: median(x["host"][k] for x in raw_runs) for k in raw_runs[0]["host"]}
        extra["host_link_gbs"] = link
    return rows, extra


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


NOTE = """\
GB/s = payload bytes per second at the server, (received + sent) / time between the 10th and
the last update; raw = one-way Send/Recv between 2 ranks at the model size (raw@blk: at the block
size). The server receives and sends through one process, so pserver/raw compares its total
payload rate with a link kept busy one way all the time: 1.0 would be a perfect two-sided server.
via = comm.transport: messages (Isend/Irecv of every payload) or shm (the node's shared window:
gradients are read in place by the update, weights copied out by the learner; payload bytes are
counted the same way). pickle = the naive parameter server with lowercase send/recv (same SGD
update, whole array).
buffer = the same loop hand-written with uppercase Send/Recv, preallocated buffers and pserver's
SGD updater, blocking (busy-polling) calls and no protocol: the ceiling of a two-sided server
here, since every update moves the model through memory three times (copy in, update, copy out).
limit = the replay of that memory work alone, on --replay-ranks processes (default: one per
core), no MPI: messages rows copy the gradient in, run one SGD pass and copy the weights out
("copy+1pass with learner copy-out"); shm rows leave out the copy in (zero-copy replay with
copy-out). ps/limit = pserver / limit: the share of the memory limit the server reaches.
Every ratio divides two figures of the same run; the runs of each column are in --json."""

NOTE_GPU = """\
--device gpu: learners and the server keep the model and gradients in CUDA device memory
(run.device=gpu), all ranks on the node's GPU(s). via = the path of the payloads: staged (device
-> pinned host buffer -> MPI -> pinned host buffer -> device; comm.cuda_aware=no) or cuda-aware
(device buffers handed to MPI). raw = the same path hand-written between two ranks, one-way:
staged = D2H copy, Send -> Recv, H2D copy; cuda-aware = Send/Recv of device buffers. The pickle
and buffer parameter servers are CPU baselines and are not run. limit = the device-to-host copy
limit of a staged server: one process replays only its memory work, no MPI (gradient H2D from
a pinned buffer, one SGD kernel, weights D2H into a pinned buffer); ps/limit = pserver / limit."""


HEADER = ("MiB", "learn", "blocks", "via", "raw", "raw@blk", "pickle", "buffer", "limit",
          "pserver", "upd/s", "ps/raw", "ps/buf", "ps/limit", "ps/pickle")  # fmt: skip


def cells(r: Row) -> list[str]:
    return [
        f"{r.size_mib:g}", f"{r.learners:d}", f"{r.blocks:d}", r.transport, f"{r.raw_gbs:.2f}",
        f"{r.raw_block_gbs:.2f}", f"{r.naive_gbs:.2f}", f"{r.buffer_gbs:.2f}",
        f"{r.limit_gbs:.2f}", f"{r.pserver_gbs:.2f}", f"{r.pserver_updates_per_s:.0f}",
        f"{r.vs_raw:.2f}", f"{r.vs_buffer:.2f}", f"{r.vs_limit:.2f}", f"{r.vs_naive:.2f}",
    ]  # fmt: skip


def rows_table(rows: list[Row], repeats: int, gpu: bool = False) -> str:
    title = f"medians of {repeats} run(s); GB/s unless noted"
    note = NOTE_GPU if gpu else NOTE
    return "\n".join([title, table(HEADER, [cells(r) for r in rows]), "", note])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser(
        __doc__, repeats=1, timeout=180.0,
        epilog="The default set (1/16/64 MiB x 1/2/4 learners, 1 block, 1 repeat) takes a few "
        "minutes on 2 cores. Workers: --raw SIZE... and --naive SIZE (run under mpiexec).",
    )  # fmt: skip
    p.add_argument("--sizes", type=float, nargs="+", default=[1, 16, 64], help="model MiB")
    p.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4], help="learner counts")
    p.add_argument("--blocks", type=int, nargs="+", default=[1], help="blocks.count values")
    p.add_argument(
        "--transports", nargs="+", default=["messages", "shm"], choices=["messages", "shm"],
        help="comm.transport values of the pserver runs (default both)",
    )  # fmt: skip
    p.add_argument(
        "--device", choices=["cpu", "gpu"], default="cpu",
        help="where the pserver runs keep their arrays (gpu: CuPy, run.device=gpu)",
    )  # fmt: skip
    p.add_argument(
        "--gpu-paths", nargs="+", default=["staged", "cuda-aware"],
        choices=["staged", "cuda-aware"],
        help="with --device gpu: payload paths (cuda-aware only where MPI is; default both)",
    )  # fmt: skip
    p.add_argument(
        "--traffic-gib", type=float, default=6.0, help="server payload per run, sets the steps"
    )
    p.add_argument("--min-steps", type=int, default=60, help="fewest updates per run")
    p.add_argument("--max-steps", type=int, default=4000, help="most updates per run")
    p.add_argument("--no-naive", action="store_true", help="skip the pickling parameter server")
    for name in ("--raw", "--raw-gpu"):
        p.add_argument(name, type=float, nargs="+", metavar="MIB", help=argparse.SUPPRESS)
    p.add_argument("--naive", type=float, metavar="MIB", help=argparse.SUPPRESS)
    p.add_argument("--buffers", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--replay", type=float, metavar="MIB", help=argparse.SUPPRESS)
    p.add_argument("--replay-gpu", type=float, metavar="MIB", help=argparse.SUPPRESS)
    p.add_argument("--zero-copy", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--replay-ranks", type=int, default=os.cpu_count() or 2,
        help="processes of the limit replay (default: one per core)",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=100, help=argparse.SUPPRESS)
    p.add_argument("--raw-seconds", type=float, default=0.3, help=argparse.SUPPRESS)
    args = parse(p, argv)
    if min(args.learners) < 1 or min(args.blocks) < 1:
        p.error("--learners and --blocks need values >= 1")
    return args


def run_worker(args: argparse.Namespace) -> bool:
    """Run the MPI program the arguments name (under mpiexec); False when they name none."""
    if args.raw:
        raw_worker(args.raw, args.raw_seconds)
    elif args.raw_gpu:
        raw_gpu_worker(args.raw_gpu, args.raw_seconds)
    elif args.naive:
        naive_worker(args.naive, args.steps, args.buffers)
    elif args.replay:
        replay_worker(args.replay, args.steps, args.zero_copy)
    elif args.replay_gpu:
        replay_gpu_worker(args.replay_gpu, args.steps)
    return bool(args.raw or args.raw_gpu or args.naive or args.replay or args.replay_gpu)


def json_doc(rows: list[Row], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "argv": sys.argv,
        "cores": os.cpu_count(),
        "rows": [dict(asdict(r), pserver_over_raw=r.vs_raw, pserver_over_pickle=r.vs_naive,
                      pserver_over_buffer=r.vs_buffer, pserver_over_limit=r.vs_limit)
                 for r in rows],
        **extra,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if run_worker(args):
        return 0
    why = gpu_missing() if args.device == "gpu" else ""
    if why:
        print(f"no GPU: skipped ({why})")
        return 0
    t0 = time.monotonic()
    rows, extra = measure(args)
    print(rows_table(rows, args.repeats, args.device == "gpu"))
    for size, gbs in extra.get("host_link_gbs", {}).items():
        print(f"host link (pinned Send/Recv, one-way) at {size} MiB: {gbs:.2f} GB/s")
    seen = idle_summary(extra["idle_before_launches"])
    print(f"({time.monotonic() - t0:.0f} s; {os.cpu_count()} cores{'; ' + seen if seen else ''})")
    write_json(args.json, json_doc(rows, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())

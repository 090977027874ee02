#!/usr/bin/env python3
"""Communication overlap of Rudra-base / Rudra-adv / Rudra-adv* (Gupta et al., §III-C, Table I).

Table I of the Rudra paper measures, in an *adversarial scenario* (the smallest minibatch, a
300 MB model, about 60 learners), the share of a learner's time spent computing rather than
blocked on communication: overlap = compute / (compute + pull + push). Rudra-base: 11.52 %,
Rudra-adv (parameter-server tree): 56.75 %, Rudra-adv* (tree + communication threads): 99.56 %.

This script reruns that scenario with pserver's own learners and reads every figure from the
statistics dump (``pserver.dump.reader.load_dump``):

===========  ==========================  ===================================================
config       pserver settings            Rudra
===========  ==========================  ===================================================
base         flat, comm.mode=blocking    Rudra-base: every learner talks to the server
adv          tree_fanout=k, blocking     Rudra-adv: aggregator tree sums the gradients
adv*-nb      tree_fanout=k, nonblocking  adv* with one thread: requests progress on waits
adv*         tree_fanout=k, thread       Rudra-adv*: a communication thread per learner
===========  ==========================  ===================================================

The model is ``model.kind=null`` (``--size-mib`` MiB of parameters, no arithmetic) and the
compute is emulated by ``inject.compute_time`` (the learner sleeps, like a host waiting for its
accelerator). ``--compute-time auto`` (the default) first runs ``base`` with no compute and
sets the compute time to ``--compute-factor`` times its measured communication time per
minibatch, so compute ≈ communication of Rudra-base. Printed per protocol and config (medians
over ``--repeats``): mean overlap over the learners, the steady-state overlap (the ``train``
rows after ``--warmup`` minibatches, i.e. without the one-off first model fetch), the blocked
pull and push seconds per learner, the bytes received by the root (the server shards'
``bytes_in``), the flat/tree ratio of that ingress (Rudra-adv's point: about k), and wall time.

``--gil`` adds the second target of the issue ("a learner that is computing keeps >= 80 % of
the communication bandwidth it has when idle"): rank 0 posts ``--gil-messages`` sends of
``--gil-size-mib`` MiB at once (and waits in pserver's back-off ``Waiter``, burning no core);
rank 1 receives them with pserver's own communication thread (``pserver.comm.engine.CommEngine``,
the engine of ``comm.mode = thread``) while its main thread is idle, runs numpy matrix products
(GIL released) or pure-Python work (GIL held); "neighbour" idles rank 1's main thread while a
third rank runs the numpy work (CPU contention without the GIL). It also runs the
``nonblocking`` pattern (requests tested only between compute chunks), a plain blocking
``Recv`` (the ceiling) and "wait-thread", a what-if that is not pserver's code: a comm thread
that blocks in ``MPI_Wait`` instead of polling ``Test`` from Python.

This file is both the driver (default) and the MPI program of ``--gil`` (``--gil-worker``).

Example::

    .venv/bin/python scripts/bench_overlap.py --repeats 3 --protocols softsync,hardsync --gil \\
        --json /tmp/overlap.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import (  # (scripts/ is on sys.path)
    RESULT,
    Launcher,
    bench_parser,
    median,
    parse,
    pserver_run,
    result_of,
    write_json,
)
from benchlib import ROOT as REPO

from pserver.job.launch import JobKilled

DIGITS_TRAIN = 1347  # digits training samples (1,797 images, data.test_fraction = 0.25)
MIB = 2**20
GB = 1e9
BASE_RSS_MIB = 200  # a pserver rank's footprint before its model buffers (docs/performance.md)
MATMUL_N = 256  # matrix order of the --gil compute: a few ms per product on one core


@dataclass(frozen=True)
class Arch:
    """One Table I implementation as pserver settings."""

    name: str
    rudra: str
    tree: bool
    mode: str


ARCHS = {
    a.name: a
    for a in (
        Arch("base", "Rudra-base", False, "blocking"),
        Arch("adv", "Rudra-adv", True, "blocking"),
        Arch("adv*-nb", "Rudra-adv* (1 thread)", True, "nonblocking"),
        Arch("adv*", "Rudra-adv*", True, "thread"),
    )
}

# copies of the model each role keeps (learner: w, w_comm, grad [+ second grad buffer];
# server: w, recv, accum, snapshot, momentum; aggregator: w, w_in, recv, total; stats: model)
COPIES = {"learner": 4, "server": 5, "aggregator": 4, "stats": 2, "data": 0}


def tree_size(n_learners: int, fanout: int) -> int:
    """Aggregators of the tree pserver builds (``pserver.plan.topology.tree_size``)."""
    from pserver.plan.topology import tree_size as size

    return size(n_learners, fanout)


def world_size(n_learners: int, fanout: int, tree: bool) -> int:
    """Ranks of a job: 1 server shard + statistics + data server + learners (+ aggregators)."""
    return 3 + n_learners + (tree_size(n_learners, fanout) if tree else 0)


def memory_need_mib(n_learners: int, fanout: int, size_mib: float) -> float:
    """Estimated resident memory of the largest job (the tree) in MiB."""
    n_agg = tree_size(n_learners, fanout)
    copies = (
        n_learners * COPIES["learner"]
        + n_agg * COPIES["aggregator"]
        + COPIES["server"]
        + COPIES["stats"]
    )
    return copies * size_mib + (3 + n_learners + n_agg) * BASE_RSS_MIB


def mem_available_mib() -> float:
    """MemAvailable of /proc/meminfo in MiB (0 where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def max_learners_in_memory(fanout: int, size_mib: float, budget_mib: float) -> int:
    """The most learners whose tree job fits ``budget_mib`` (memory is not the only limit)."""
    n = 1
    while memory_need_mib(n + 1, fanout, size_mib) <= budget_mib and n < 4096:
        n += 1
    return n


# -- the --gil worker: pserver's communication thread under compute -------------------------------


class _Receiver:
    """The ``progress()`` that pserver's communication engine (``pserver.comm.engine``) drives.

    Each completed receive counts its bytes and posts the next one, so the engine that pserver's
    ``comm.mode = thread`` learners run is measured as it is, without a whole training job.
    ``closing`` is set after the last message (the engine's stop event, or a plain event).
    """

    def __init__(self, comm: Any, buf: Any, count: int, closing: Any) -> None:
        import threading

        self.lock = threading.Condition()  # the what-if thread's (the engine has its own)
        self.closing = closing
        self.comm, self.buf, self.remaining = comm, buf, count
        self.first: float | None = None
        self.done_at = 0.0
        self.work = 0  # compute chunks the main thread finished so far
        self.work_window = (0, 0)  # ``work`` at the first and at the last message
        self.req = comm.Irecv(buf, 0, 7)

    def progress(self) -> bool:
        if self.req is None or not self.req.Test():
            return False
        self.remaining -= 1
        if self.first is None:  # the clock starts at the first message: no start-up skew
            self.first, self.work_window = time.perf_counter(), (self.work, 0)
        if self.remaining:
            self.req = self.comm.Irecv(self.buf, 0, 7)
        else:
            self.req, self.done_at = None, time.perf_counter()
            self.work_window = (self.work_window[0], self.work)
            self.closing.set()
        return True


def _matmul_chunk(a: Any, c: Any) -> int:
    import numpy as np

    np.matmul(a, a, out=c)
    return 1


def _python_chunk(_a: Any, _c: Any) -> int:
    total = 0
    for i in range(20000):  # ~1 ms of bytecode: the GIL is held throughout
        total += i * i
    return 1 if total >= 0 else 0


def _wait_loop(eng: _Receiver) -> None:
    """Not pserver's loop: a comm thread that sits in ``MPI_Wait`` (GIL released throughout).

    The what-if of the --gil check: how much of the bandwidth a thread keeps when it makes no
    Python-level polling between the MPI calls that move the data.
    """
    while eng.req is not None:
        eng.req.Wait()
        with eng.lock:
            eng.progress()  # Test() of the completed (now null) request is true: count, repost


def _finished(eng: _Receiver) -> Any:
    """The ``done`` test of a ``Waiter.until`` that drives ``eng`` (the nonblocking learner)."""
    return lambda: eng.progress() and eng.closing.is_set()


def gil_worker(size_mib: float, messages: int, solo_seconds: float) -> None:
    """Rank 0 sends; rank 1 receives with pserver's comm thread under each kind of compute."""
    import logging
    import threading

    import numpy as np
    from mpi4py import MPI

    from pserver.comm.engine import CommEngine
    from pserver.comm.waiting import PeerLog, Waiter

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    n = max(1, int(size_mib * MIB) // 4)
    buf = np.ones(n, np.float32)
    a = np.random.default_rng(0).random((MATMUL_N, MATMUL_N))
    c = np.empty_like(a)
    chunks = {"numpy": _matmul_chunk, "python": _python_chunk}
    out: dict[str, Any] = {"thread_level": MPI.Query_thread()}
    # thread: pserver's comm thread; nonblocking: Test() only between compute chunks
    # "neighbour": rank 1's main thread idles while rank 2, another process, runs the numpy
    # work: the CPU contention of the numpy case without any GIL in the way
    cases = [
        ("recv", "idle"),
        ("thread", "idle"),
        ("thread", "numpy"),
        ("thread", "python"),
        ("solo", "neighbour"),  # rank 2 measures its compute rate alone, nothing is sent
        ("thread", "neighbour"),
        ("nonblocking", "idle"),
        ("nonblocking", "numpy"),
        ("nonblocking", "python"),
        ("wait-thread", "idle"),
        ("wait-thread", "numpy"),
        ("wait-thread", "python"),
    ]
    waiter = Waiter(logging.getLogger("bench_overlap"), PeerLog())
    flag = np.zeros(1, np.float64)
    neighbour_solo = 0.0
    for mode, work in [("recv", "warm-up"), *cases]:
        # every rank that waits, waits in the back-off Waiter: MPICH's Barrier would busy-poll
        # and take a core from the rank being measured (2 cores here)
        waiter.wait(comm.Ibarrier(), "the other ranks")
        if mode == "solo":
            if rank == 2:
                done, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < solo_seconds:
                    done += _matmul_chunk(a, c)
                neighbour_solo = done / (time.perf_counter() - t0)
            continue
        if rank == 0:  # every send posted at once, waited for with pserver's back-off Waiter:
            reqs = [comm.Isend(buf, 1, 7) for _ in range(messages)]  # the sender burns no core
            waiter.waitall(reqs, "sends")
            continue
        if rank == 2:
            if work == "neighbour":
                stop, done = comm.Irecv(flag, 1, 9), 0
                while not stop.Test():
                    done += _matmul_chunk(a, c)
                comm.send(flag[0] and done / flag[0] / neighbour_solo, dest=1, tag=10)
            continue
        if rank != 1:
            continue
        if mode == "recv":  # the ceiling: a blocking Recv in the main thread (MPICH busy-polls)
            comm.Recv(buf, 0, 7)
            t0 = time.perf_counter()
            for _ in range(messages - 1):
                comm.Recv(buf, 0, 7)
            elapsed = time.perf_counter() - t0
            out[f"recv/{work}"] = {
                "seconds": elapsed,
                "gbps": (messages - 1) * buf.nbytes / elapsed / GB,
            }
            continue
        chunk = chunks.get(work)
        solo = 0.0
        if chunk is not None:  # the compute rate with no communication, just before the case
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < solo_seconds:
                done += chunk(a, c)
            solo = done / (time.perf_counter() - t0)
        case_start = time.perf_counter()
        if mode == "thread":  # pserver's engine: its thread stops after the last message
            eng = _Receiver(comm, buf, messages, threading.Event())
            engine = CommEngine(eng.progress, waiter, threaded=True)
            eng.closing = engine.stop
            engine.start()
            if chunk is None:
                eng.closing.wait()
            while chunk is not None and not eng.closing.is_set():
                eng.work += chunk(a, c)
            engine.close()
            if engine.error is not None:
                raise engine.error
        elif mode == "wait-thread":
            eng = _Receiver(comm, buf, messages, threading.Event())
            thread = threading.Thread(target=_wait_loop, args=(eng,), daemon=True)
            thread.start()
            if chunk is None:
                eng.closing.wait()
            while chunk is not None and not eng.closing.is_set():
                eng.work += chunk(a, c)
            thread.join()
        else:
            eng = _Receiver(comm, buf, messages, threading.Event())
            if chunk is None:  # idle: a learner blocked in its Waiter
                waiter.until(_finished(eng), "messages")
            while chunk is not None and not eng.closing.is_set():
                eng.work += chunk(a, c)
                eng.progress()
        elapsed = eng.done_at - (eng.first or eng.done_at)
        moved = (messages - 1) * buf.nbytes  # bytes that arrived after the clock started
        row = {"seconds": elapsed, "gbps": moved / max(elapsed, 1e-9) / GB}
        if work == "neighbour" and comm.Get_size() > 2:  # its share over the whole case
            flag[0] = time.perf_counter() - case_start
            comm.Send(flag, 2, 9)
            row["compute_share"] = comm.recv(source=2, tag=10)
        if chunk is not None:
            row["compute_rate"] = (eng.work_window[1] - eng.work_window[0]) / max(elapsed, 1e-9)
            row["solo_rate"] = solo
            row["compute_share"] = row["compute_rate"] / solo
        out[f"{mode}/{work}"] = row
    if rank == 1:
        print(RESULT + json.dumps(out), flush=True)


# -- driver ---------------------------------------------------------------------------------------


JobStuck = JobKilled  # a job killed by the watchdog (EndWatch) or the timeout


class EndWatch:
    """Spots a job whose training is over but which does not end (Rudra's STOP never arrives).

    Training is over once the statistics server recorded the test of the last epoch; every
    rank should then exit within seconds. Reads only the small ``test`` group of the dump,
    without HDF5's file lock (the writer still holds the file).
    """

    def __init__(self, path: Path, epochs: int, grace: float) -> None:
        self.path, self.epochs, self.grace = path, epochs, grace
        self.ended_at: float | None = None

    def __call__(self) -> str | None:
        if self.ended_at is None:
            try:
                import h5py

                with h5py.File(self.path, "r", locking=False) as f:
                    epochs = f["test/epoch"][()] if "test/epoch" in f else []
                    last = float(f["updates/time"][-1]) if "updates/time" in f else float("nan")
            except (OSError, KeyError, ValueError, IndexError):
                return None
            if len(epochs) and max(epochs) >= self.epochs:
                self.ended_at, self.last_update = time.monotonic(), last
            return None
        if time.monotonic() - self.ended_at > self.grace:
            return (
                f"training ended (last update at t={self.last_update:.1f} s, final test done) "
                f"but the job was still running {self.grace:.0f} s later: learners never got STOP"
            )
        return None


class Runner:
    """Launches this benchmark's jobs (:class:`benchlib.Launcher`: a hard timeout, and an
    :class:`EndWatch` on training jobs; either kills the job's whole process group)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.launcher = Launcher.from_args(__file__, args, cwd=REPO)
        self.idle_seen = self.launcher.idle_seen

    def pserver(self, n: int, out_dir: Path, overrides: list[str]) -> float:
        """One training job; returns the launcher's elapsed seconds (start-up included)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *pserver_run(self.args),
            str(REPO / "examples/quickstart.toml"),
            f"run.out_dir={out_dir}",
            "run.overwrite=true",
            "stats.progress=false",
            *overrides,
        ]
        watch = EndWatch(out_dir / "stats.h5", self.args.epochs, self.args.grace)
        return self.launcher.run(n, cmd, log=out_dir / "run.log", watch=watch).seconds

    def gil(self) -> dict[str, Any]:
        a = self.args
        cmd = [
            sys.executable, str(Path(__file__).resolve()), "--gil-worker",
            "--gil-size-mib", str(a.gil_size_mib), "--gil-messages", str(a.gil_messages),
            "--switch-interval", str(a.switch_interval),
        ]  # fmt: skip
        log = Path(a.out_dir) / "gil.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        return result_of(self.launcher.run(3, cmd, log=log).stdout, "the GIL check")


def measure(dump_dir: Path, warmup: int) -> dict[str, Any]:
    """The Table I figures of one run, from its statistics dump."""
    import numpy as np

    from pserver.dump.reader import load_dump

    dump = load_dump(dump_dir / "stats.h5")
    lrn, train, grads = dump.group("learners"), dump.group("train"), dump.group("gradients")
    if not lrn:
        raise RuntimeError(f"{dump_dir}: the dump has no learners group (did the run finish?)")
    servers, aggs = dump.group("servers"), dump.group("aggregators")
    steady, per_iter_comm = [], []
    for learner in np.unique(train["learner"]):
        rows = train["learner"] == learner
        order = np.argsort(train["step"][rows])
        comp = train["compute_time"][rows][order][warmup:]
        comm = (train["pull_time"][rows] + train["push_time"][rows])[order][warmup:]
        if comp.size:
            steady.append(float(comp.sum() / max(comp.sum() + comm.sum(), 1e-12)))
            per_iter_comm.append(float(np.median(comm)))
    applied = grads.get("update", np.zeros(0)) != -1
    stale = grads["staleness"][applied] if applied.any() else np.zeros(1)

    def total(group: dict[str, Any], key: str) -> int:
        return int(np.sum(group[key])) if key in group else 0

    return {
        "learners": int(len(lrn["learner"])),
        "minibatches": float(np.mean(lrn["minibatches"])),
        "overlap": float(np.mean(lrn["overlap"])),
        "overlap_min": float(np.min(lrn["overlap"])),
        "steady_overlap": float(np.mean(steady)) if steady else float("nan"),
        "compute_s": float(np.mean(lrn["compute_time"])),
        "pull_s": float(np.mean(lrn["pull_time"])),
        "push_s": float(np.mean(lrn["push_time"])),
        "first_pull_s": float(np.mean(train["pull_time"][train["step"] == 0])),
        "comm_per_iter_s": float(np.median(per_iter_comm)) if per_iter_comm else float("nan"),
        "root_bytes_in": total(servers, "bytes_in"),
        "root_bytes_out": total(servers, "bytes_out"),
        "agg_bytes_in": total(aggs, "bytes_in"),
        "agg_bytes_out": total(aggs, "bytes_out"),
        "updates": int(np.max(servers["updates"])) if "updates" in servers else 0,
        "dropped_after_stop": total(servers, "dropped_after_stop"),
        "staleness_mean": float(np.mean(stale)),
        "staleness_max": int(np.max(stale)),
        "wall_s": float(dump.attrs.get("wall_time", float("nan"))),
    }


def measure_stuck(dump_dir: Path) -> dict[str, Any]:
    """What the dump of a killed job shows: when training ended and what ran after it."""
    import numpy as np

    from pserver.dump.reader import DumpError, load_dump

    try:
        dump = load_dump(dump_dir / "stats.h5")
    except DumpError as e:
        return {"unreadable": str(e)}
    train, updates = dump.group("train"), dump.group("updates")
    if not train or not updates:
        return {"train_rows": dump.rows("train"), "updates": dump.rows("updates")}
    end = float(updates["time"][-1])
    during = train["time"] <= end
    comp = train["compute_time"][during].sum()
    comm = (train["pull_time"] + train["push_time"])[during].sum()
    return {
        "updates": int(updates["timestamp"][-1]),
        "training_end_s": end,
        "overlap_until_end": float(comp / max(comp + comm, 1e-12)),
        "minibatches_until_end": float(during.sum() / len(np.unique(train["learner"]))),
        "minibatches_after_end": int((~during).sum()),
        "last_row_s": float(train["time"].max()),
    }


def overrides(args: argparse.Namespace, protocol: str, arch: Arch, compute: float) -> list[str]:
    """The pserver-run overrides of one config (``examples/quickstart.toml`` underneath)."""
    proto = (
        ["protocol.name=softsync", "protocol.n=1"]
        if protocol == "softsync"
        else [f"protocol.name={protocol}"]
    )
    return [
        *proto,
        "model.kind=null",
        f"model.size_mib={args.size_mib}",
        f"data.batch_size={args.batch_size}",
        f"run.epochs={args.epochs}",
        f"cluster.tree_fanout={args.fanout if arch.tree else 0}",
        f"comm.mode={arch.mode}",
        f"inject.compute_time={compute}",
        "stats.test_every=1000000",  # no model test in the middle (the last epoch still tests)
        *args.set,
    ]


def calibrate(runner: Runner, args: argparse.Namespace, protocol: str) -> dict[str, Any]:
    """Rudra-base with no compute: the blocked seconds per minibatch of a saturated server."""
    n = world_size(args.learners, args.fanout, False)
    runs = []
    for rep in range(args.calibrate_repeats):
        d = Path(args.out_dir) / protocol / f"calibrate-{rep}"
        runner.pserver(n, d, overrides(args, protocol, ARCHS["base"], 0.0))
        runs.append(measure(d, args.warmup))
    comm = median([r["comm_per_iter_s"] for r in runs])
    each = ", ".join(f"{r['comm_per_iter_s']:.3f}" for r in runs)
    print(
        f"[{protocol}] calibration: base with no compute blocks {comm:.3f} s per minibatch "
        f"(runs: {each})",
        file=sys.stderr,
        flush=True,
    )
    return {"comm_per_iter_s": comm, "runs": runs}


def run_protocol(runner: Runner, args: argparse.Namespace, protocol: str) -> dict[str, Any]:
    """Calibrate (if asked), then run every config at every compute time, ``--repeats`` times.

    The repeats are interleaved (repeat 0 of everything, then repeat 1, ...) so that a burst of
    load from other jobs on the machine spreads over the configs instead of hitting one.
    """
    out_root = Path(args.out_dir) / protocol
    calibration = None
    if args.compute_time is None:  # "auto": compute = factor x the communication of Rudra-base
        calibration = calibrate(runner, args, protocol)
        points = [(f, round(f * calibration["comm_per_iter_s"], 3)) for f in args.compute_factor]
    else:
        points = [(None, c) for c in args.compute_time]
    runs = {c: {name: [] for name in args.configs} for _, c in points}
    for rep in range(args.repeats):
        for _, compute in points:
            for name in args.configs:
                arch = ARCHS[name]
                n = world_size(args.learners, args.fanout, arch.tree)
                d = out_root / f"c{compute:g}" / f"{name.replace('*', 'star')}-{rep}"
                try:
                    elapsed = runner.pserver(n, d, overrides(args, protocol, arch, compute))
                    row = measure(d, args.warmup)
                    row["launch_s"] = elapsed
                except JobStuck as e:
                    print(f"[{protocol}] {name} repeat {rep}: STUCK: {e}", file=sys.stderr)
                    row = {"error": str(e)[:2000], "stuck": measure_stuck(d)}
                except RuntimeError as e:
                    print(f"[{protocol}] {name} repeat {rep}: FAILED: {e}", file=sys.stderr)
                    row = {"error": str(e)[:2000]}
                row["ranks"] = n
                runs[compute][name].append(row)
                if "error" not in row:
                    print(
                        f"[{protocol}] compute {compute:g} s {name:8s} rep {rep}: overlap "
                        f"{row['overlap']:.1%} (steady {row['steady_overlap']:.1%}), "
                        f"wall {row['wall_s']:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    return {
        "calibration": calibration,
        "points": [
            {"factor": f, "compute_time": c, "runs": runs[c], "table": summarize(runs[c])}
            for f, c in points
        ],
    }


SUMMARY_KEYS = (
    "overlap",
    "steady_overlap",
    "pull_s",
    "push_s",
    "first_pull_s",
    "compute_s",
    "root_bytes_in",
    "root_bytes_out",
    "agg_bytes_in",
    "agg_bytes_out",
    "updates",
    "staleness_mean",
    "staleness_max",
    "dropped_after_stop",
    "wall_s",
    "minibatches",
)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Medians over the repeats, and the root-ingress ratio of flat (base) to each tree."""
    rows = []
    for name, reps in runs.items():
        ok = [r for r in reps if "error" not in r]
        row: dict[str, Any] = {
            "config": name,
            "rudra": ARCHS[name].rudra,
            "ok": len(ok),
            "repeats": len(reps),
            "ranks": reps[0]["ranks"] if reps else 0,
            "learners": ok[0]["learners"] if ok else 0,
        }
        for k in SUMMARY_KEYS:
            row[k] = median([r[k] for r in ok])
        row["overlap_range"] = [
            min((r["overlap"] for r in ok), default=float("nan")),
            max((r["overlap"] for r in ok), default=float("nan")),
        ]
        stuck = [r["stuck"] for r in reps if "overlap_until_end" in r.get("stuck", {})]
        row["stuck"] = len(stuck)
        row["stuck_overlap"] = median([x["overlap_until_end"] for x in stuck])
        row["stuck_after"] = median([x["minibatches_after_end"] for x in stuck])
        rows.append(row)
    flat = next((r["root_bytes_in"] for r in rows if r["config"] == "base"), float("nan"))
    for r in rows:
        r["ingress_ratio"] = flat / r["root_bytes_in"] if r["root_bytes_in"] else float("nan")
    return rows


def fmt_table(protocol: str, point: dict[str, Any], args: argparse.Namespace) -> str:
    """One Table I: a row per config, medians over the repeats."""
    factor = point["factor"]
    how = f" ({factor:g} x base's saturated communication)" if factor is not None else ""
    head = (
        f"protocol {protocol}: λ={args.learners}, tree fan-out k={args.fanout}, "
        f"model {args.size_mib:g} MiB, μ={args.batch_size}, epochs={args.epochs}, "
        f"inject.compute_time={point['compute_time']:g} s{how}; medians of {args.repeats} run(s)"
    )
    cols = [
        "config  ",
        "ranks",
        "  λ",
        "iters",
        "overlap",
        "  range",
        "steady",
        "pull s",
        "push s",
        "1st pull",
        "root in GB",
        "flat/tree",
        "root out GB",
        "σ mean",
        "wall s",
    ]
    lines = [head, " | ".join(cols), "-" * 142]
    for r in point["table"]:
        if not r["ok"]:
            what = f"all {r['repeats']} run(s) failed"
            if r["stuck"]:
                what += (
                    f"; {r['stuck']} never ended (learners kept pushing after the final update: "
                    f"{r['stuck_after']} minibatches after it); overlap until the end "
                    f"{r['stuck_overlap']:.1%}"
                )
            lines.append(f"{r['config']:8s} | {what}")
            continue
        rng = r["overlap_range"]
        if r["ok"] < r["repeats"]:
            lines.append(
                f"{r['config']:8s} | {r['repeats'] - r['ok']} of {r['repeats']} run(s) "
                f"failed ({r['stuck']} never ended); medians of the others:"
            )
        lines.append(
            " | ".join(
                [
                    f"{r['config']:8s}",
                    f"{r['ranks']:5d}",
                    f"{r['learners']:3d}",
                    f"{r['minibatches']:5.1f}",
                    f"{r['overlap']:7.1%}",
                    f"{rng[0]:3.0%}-{rng[1]:3.0%}",
                    f"{r['steady_overlap']:6.1%}",
                    f"{r['pull_s']:6.2f}",
                    f"{r['push_s']:6.2f}",
                    f"{r['first_pull_s']:8.2f}",
                    f"{r['root_bytes_in'] / GB:10.2f}",
                    f"{r['ingress_ratio']:9.2f}",
                    f"{r['root_bytes_out'] / GB:11.2f}",
                    f"{r['staleness_mean']:6.1f}",
                    f"{r['wall_s']:6.1f}",
                ]
            )
        )
    return "\n".join(lines)


def fmt_gil(res: dict[str, Any]) -> str:
    lines = [
        f"GIL check: pserver's comm thread receiving {res['size_mib']:g} MiB messages "
        f"(MPI thread level {res['runs'][0].get('thread_level')}), {res['messages']} per case, "
        f"medians of {len(res['runs'])} run(s)",
        "mode        | main thread | GB/s  | vs idle (range)   | compute kept",
        "-" * 70,
    ]
    for key, row in res["summary"].items():
        mode, work = key.split("/")
        kept = "-" if row["compute_share"] is None else f"{row['compute_share']:.0%}"
        lo, hi = row["vs_idle_range"]
        lines.append(
            f"{mode:11s} | {work:11s} | {row['gbps']:5.2f} | {row['vs_idle']:4.0%} "
            f"({lo:4.0%}-{hi:4.0%}) | {kept}"
        )
    return "\n".join(lines)


def run_gil(runner: Runner, args: argparse.Namespace) -> dict[str, Any]:
    """The --gil check, ``--gil-repeats`` times; ratios to idle are taken within each run.

    The idle baseline of a mode ran seconds before its compute cases, so a burst of load from
    other jobs shifts both; the median of the per-run ratios is what the target is read from.
    """
    runs = []
    for _ in range(args.gil_repeats):
        try:
            runs.append(runner.gil())
        except RuntimeError as e:
            print(f"gil: FAILED: {e}", file=sys.stderr)
    summary: dict[str, Any] = {}
    keys = [k for k in (runs[0] if runs else {}) if "/" in k and not k.endswith("warm-up")]
    keys = [k for k in keys if not k.startswith("solo/")]
    for key in keys:
        mode = key.split("/")[0]
        ratios = [r[key]["gbps"] / r[f"{mode}/idle"]["gbps"] for r in runs]
        share = [r[key]["compute_share"] for r in runs if "compute_share" in r[key]]
        summary[key] = {
            "gbps": median([r[key]["gbps"] for r in runs]),
            "vs_idle": median(ratios),
            "vs_idle_range": [min(ratios), max(ratios)],
            "compute_share": median(share) if share else None,
        }
    return {
        "size_mib": args.gil_size_mib,
        "messages": args.gil_messages,
        "runs": runs,
        "summary": summary,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from pserver.plan.config import CommConfig

    p = bench_parser(
        "Rudra Table I (§III-C): communication overlap of Rudra-base / -adv / -adv* and the "
        "root's ingress, flat vs tree, in the adversarial scenario (small minibatch, large "
        "model, many learners, fixed emulated compute).",
        repeats=3, timeout=600.0, quiet_idle=0.0,
        epilog="example: .venv/bin/python scripts/bench_overlap.py --repeats 3 --gil "
        "--json /tmp/overlap.json",
    )  # fmt: skip
    add = p.add_argument
    add("--learners", type=int, default=12, help="learners λ (default 12)")
    add("--fanout", type=int, default=4, help="tree fan-out k (default 4)")
    add("--size-mib", type=float, default=64.0, help="model size (default 64 MiB)")
    add("--batch-size", type=int, default=0, help="minibatch μ (default 0: smallest μ >= 1 "
        "giving about --iterations minibatches per learner)")  # fmt: skip
    add("--iterations", type=int, default=40,
        help="minibatches per learner wanted when --batch-size is 0 (default 40)")  # fmt: skip
    add("--epochs", type=int, default=1, help="epochs of the digits set (default 1)")
    add("--protocols", default="softsync", help="comma list of hardsync, softsync (1-softsync, "
        "Rudra Table IV), async (default softsync)")  # fmt: skip
    add("--configs", default="base,adv,adv*-nb,adv*",
        help=f"comma list of {', '.join(ARCHS)} (default all)")  # fmt: skip
    add("--compute-time", default="auto", help="inject.compute_time in s (comma list for a "
        "sweep), or 'auto' (default): calibrate on base with no compute and use "
        "--compute-factor")  # fmt: skip
    add("--compute-factor", default="1", help="auto: compute = each of these (comma list) x "
        "base's blocked seconds per minibatch with no compute (default 1)")  # fmt: skip
    add("--calibrate-repeats", type=int, default=2,
        help="calibration runs, median taken (default 2)")  # fmt: skip
    add("--warmup", type=int, default=5, help="minibatches per learner left out of the "
        "steady-state overlap (default 5)")  # fmt: skip
    add("--grace", type=float, default=45.0,
        help="kill a job still running this many s after its final test (default 45)")  # fmt: skip
    add("--out-dir", default="/tmp/bench_overlap", help="dumps and logs go here")
    add("--gil", action="store_true", help="also run the GIL bandwidth check")
    add("--gil-only", action="store_true", help="only run the GIL bandwidth check")
    add("--gil-size-mib", type=float, default=64.0,
        help="message size of the GIL check (default 64 MiB, one model block)")  # fmt: skip
    add("--gil-messages", type=int, default=80,
        help="messages per case of the GIL check (default 80)")  # fmt: skip
    add("--gil-repeats", type=int, default=7, help="runs of the GIL check (default 7)")
    add("--switch-interval", type=float, default=CommConfig().switch_interval,
        help="sys.setswitchinterval of the GIL check's ranks, s (default: pserver's "
        "comm.switch_interval; 0 keeps Python's 5 ms)")  # fmt: skip
    add("--gil-worker", action="store_true", help=argparse.SUPPRESS)
    return check_args(p, parse(p, argv))


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The comma lists split and checked, the automatic minibatch size chosen."""
    args.protocols = [s for s in args.protocols.split(",") if s]
    args.configs = [s for s in args.configs.split(",") if s]
    for proto in args.protocols:
        if proto not in ("hardsync", "softsync", "async"):
            p.error(f"--protocols: unknown protocol {proto!r} (hardsync, softsync, async)")
    for name in args.configs:
        if name not in ARCHS:
            p.error(f"--configs: unknown config {name!r} ({', '.join(ARCHS)})")
    if args.learners < 1 or args.fanout < 2:
        p.error("--learners must be >= 1 and --fanout >= 2")
    try:
        args.compute_factor = [float(x) for x in args.compute_factor.split(",") if x]
        args.compute_time = (
            None
            if args.compute_time == "auto"
            else [float(x) for x in args.compute_time.split(",") if x]
        )
    except ValueError:
        p.error("--compute-time / --compute-factor: expected numbers (comma lists) or 'auto'")
    if args.batch_size <= 0:
        args.batch_size = max(
            1, round(DIGITS_TRAIN * args.epochs / (args.learners * args.iterations))
        )
    return args


def memory_check(args: argparse.Namespace) -> dict[str, Any] | None:
    """The memory the largest job needs against what is free (printed); None if it won't fit."""
    need = memory_need_mib(args.learners, args.fanout, args.size_mib)
    avail = mem_available_mib()
    fit = max_learners_in_memory(args.fanout, args.size_mib, 0.8 * avail) if avail else None
    print(
        f"memory: ~{need / 1024:.1f} GiB estimated for λ={args.learners} (tree k={args.fanout}, "
        f"{args.size_mib:g} MiB model); {avail / 1024:.1f} GiB available would hold λ≈{fit}; "
        f"{os.cpu_count()} cores",
        file=sys.stderr,
        flush=True,
    )
    if avail and need > 0.8 * avail:
        print("error: that job would not fit in memory; lower --learners", file=sys.stderr)
        return None
    return {"need_mib": need, "available_mib": avail, "learners_that_fit": fit}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gil_worker:
        if args.switch_interval > 0:
            sys.setswitchinterval(args.switch_interval)
        gil_worker(args.gil_size_mib, args.gil_messages, solo_seconds=0.5)
        return 0
    memory = memory_check(args)
    if memory is None:
        return 2
    runner = Runner(args)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result: dict[str, Any] = {"settings": settings, "memory": memory, "protocols": {}}
    del settings["gil_worker"]
    texts = []
    for proto in [] if args.gil_only else args.protocols:
        res = result["protocols"][proto] = run_protocol(runner, args, proto)
        texts.extend(fmt_table(proto, point, args) for point in res["points"])
    if args.gil or args.gil_only:
        result["gil"] = run_gil(runner, args)
        if result["gil"]["runs"]:
            texts.append(fmt_gil(result["gil"]))
    result["cpu_idle_before_runs"] = runner.idle_seen
    print("\n\n".join(texts))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

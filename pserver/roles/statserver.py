"""Statistics server: collects what every rank reports, tests the model at epoch ends, and
writes the HDF5 dump as the run goes (published every ``stats.flush_interval`` seconds).

Nothing waits for this rank while training: rows come as non-blocking JSON batches
(``pserver.comm.records``) and model snapshots as non-blocking sends that a shard skips while
its previous one is still in flight. Hence a block may be missing from an epoch's snapshot:
because a shard sends its snapshots of a block in epoch order and MPI does not let messages
from one sender on one tag overtake each other, a block of epoch ``e`` that arrives while an
older epoch still lacks that block proves the older epoch's test was skipped; that epoch is
dropped (``skipped_tests`` row) instead of waiting forever. The final epoch is never skipped.

A dump that cannot be written (disk full, I/O error) ends the run: one error line, and the
dump stays as it was at its last complete flush (see ``pserver.dump.writer``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import datetime, timezone
from typing import Any

import numpy as np
from mpi4py import MPI

from pserver import __version__
from pserver.ckpt.files import State
from pserver.comm.departures import is_failure
from pserver.comm.doorbell import ring
from pserver.comm.records import decode
from pserver.comm.waiting import usable_cores
from pserver.comm.wire import Header, Tag, WireError, header_buffer, model_epoch
from pserver.dump.progress import sigma_text
from pserver.dump.schema import DATA_SCALING
from pserver.dump.writer import DumpWriteError, StatsWriter
from pserver.roles.live import Live
from pserver.roles.losses import Losses
from pserver.runtime.context import Context
from pserver.runtime.provenance import dump_attrs
from pserver.runtime.rundir import point_latest
from pserver.runtime.signals import STOP


class StatsServer:
    def __init__(self, ctx: Context) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        self.comm = ctx.channels.stats
        self.waiter = ctx.waiter()
        lay = ctx.layout
        self.live = set(lay.servers) | set(lay.learners) | set(lay.aggregators)
        self.hbuf = header_buffer()
        self.models: dict[int, tuple[np.ndarray, set[int], int]] = {}
        self.sigma_sum = self.sigma_n = self.sigma_max = 0
        self.dropped: dict[int, dict[str, int]] = {}  # rank -> group -> rows it dropped
        self.tested: set[int] = set()
        self.skipped: set[int] = set()
        resume = ctx.resume
        self.node_cpu0, self.cpu0 = node_cpu_seconds(), time.process_time()
        attrs = self.attrs()
        if resume is not None and resume.continued:  # a periodic pause: the same job goes on
            for key in ("started", "restarts"):
                del attrs[key]
        self.writer = StatsWriter(
            ctx.dump_path, attrs, self.cfg.stats.flush_interval, resume is not None
        )
        self.rows: dict[str, int] = {}
        if resume is not None:
            self.restore(resume.state)
        # progress lines and TensorBoard scalars, fed the rows the dump gets (issue 24)
        self.outputs = Live(self.cfg, ctx.train_size, ctx.dump_path.parent, ctx.log,
                         self.writer.rows(), resume is None, ctx.t0)  # fmt: skip
        self.losses = Losses(ctx.layout, ctx.peers, ctx.log, ctx.now)
        self.handlers = {
            Tag.RECORDS: self.on_records,
            Tag.MODEL: self.on_model,
            Tag.BYE: self.on_bye,
            Tag.SERVER_BYE: self.on_bye,
        }

    def attrs(self) -> dict[str, Any]:
        lay = self.ctx.layout
        return {
            "config": self.cfg.to_dict(),
            "protocol": self.cfg.protocol.name,
            "n_learners": len(lay.learners),
            "n_servers": len(lay.servers),
            "world_size": lay.world_size,
            "pserver_version": __version__,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "cores": usable_cores(),  # of this rank's node: pserver-sim --calibrate reads it
            **self.scaling_attrs(),
            **dump_attrs(lay, self.ctx.nodes, self.ctx.hosts, self.cfg.run.out_dir,
                         self.ctx.pids),
        }

    def scaling_attrs(self) -> dict[str, Any]:
        """``data_scale`` (JSON: what data.scale applied), for the dump's root."""
        scaling = getattr(self.ctx.dataset, "scaling", None)
        return {} if scaling is None else {"data_scale": scaling.describe()}

    def write_scaling(self) -> None:
        """``model/input_offset`` and ``model/input_scale``: the constants the features were
        scaled with."""
        scaling = getattr(self.ctx.dataset, "scaling", None)
        if scaling is not None:
            for name, values in zip(DATA_SCALING, (scaling.offset, scaling.scale), strict=True):
                self.writer.replace_dataset(name, values)

    def run(self) -> None:
        self.ctx.log.info("writing %s", self.ctx.dump_path)
        self.link_latest()
        try:
            with self.writer:
                self.write_scaling()
                self.serve()
        except DumpWriteError as exc:
            self.fail(exc)
        self.ctx.log.info("dump written to %s", self.ctx.dump_path)

    def link_latest(self) -> None:
        """Point the runs' ``latest`` link here (pserver.runtime.rundir); a failure only warns: the
        dump itself is where the log says."""
        if self.ctx.latest is None:
            return
        try:
            point_latest(self.ctx.latest, self.ctx.dump_path.parent)
        except OSError as e:
            self.ctx.log.warning("cannot point %s at this run: %s", self.ctx.latest, e)

    def serve(self) -> None:
        while self.live:
            # a matched probe (Waiter.probe): each handler receives the message it is given
            msg, status = self.waiter.probe(
                self.comm, lambda: f"reports from ranks {sorted(self.live)}",
                also=lambda: self.losses.pending(self.live),
                # every sender rings after it sent rows, a snapshot or its goodbye
                # (RecordBuffer, Snapshots): sleep on the doorbell where they share it
                rung_by=self.live,
            )
            self.losses.take(self.live)
            if msg is None:
                continue
            tag = status.Get_tag()
            handler = self.handlers.get(tag)  # type: ignore[call-overload]
            if tag == Tag.MODEL and self.from_lost(status.Get_source()):
                self.drop(msg, status)  # half a snapshot of a dead learner (issue 22)
                continue
            if handler is None:
                raise WireError(f"stats server got unknown tag {tag} from {status.Get_source()}")
            try:
                handler(msg, status)
            except MPI.Exception as e:  # the sender died with its message half sent (ULFM)?
                self.lost_in_transit(e, status.Get_source())
                continue
            self.writer.maybe_flush()
        self.losses.write(self.writer)
        self.skip_untested()
        self.outputs.close(self.ctx.now(), self.sigma())
        self.final_line()
        total = sum(sum(g.values()) for g in self.dropped.values())
        if total:
            self.ctx.log.warning(
                "the dump lacks %d statistics rows that ranks %s dropped while this server "
                "lagged behind (dropped_records)",
                total,
                sorted(self.dropped),
            )
        self.writer.set_attrs(
            "/",
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            wall_time=self.ctx.now(),
            stats_cpu_time=time.process_time() - self.cpu0,
            **node_cpu_attr(self.node_cpu0),
        )
        self.rows = self.writer.rows()

    # -- checkpoints (pserver.ckpt.drivers.end) ---------------------------------------------------

    def state(self) -> State:
        """What the progress lines and the skipped-test rows need; the dump is on disk."""
        attrs = {
            "role": "stats",
            "tested": sorted(self.tested),
            "skipped": sorted(self.skipped),
            "sigma": [self.sigma_sum, self.sigma_n, self.sigma_max],
            "dump_rows": self.rows,
            "elapsed": self.ctx.now(),
        }
        return State({}, attrs)

    def restore(self, state: State) -> None:
        """Continue the dump: its rows stay, a ``restarts`` attribute counts the resumptions."""
        a = state.attrs
        self.tested, self.skipped = set(a["tested"]), set(a["skipped"])
        self.sigma_sum, self.sigma_n, self.sigma_max = a["sigma"]
        self.writer.truncate(a["dump_rows"])  # rows after the checkpoint come again
        resume = self.ctx.resume
        if resume.continued:  # a periodic checkpoint's pause: the same job goes on
            return
        self.writer.set_attrs(
            "/", restarts=resume.restarts, resumed_generation=resume.manifest.generation
        )

    def fail(self, exc: DumpWriteError) -> None:
        """End the whole run on a dump that cannot be written: one line, then abort."""
        from mpi4py import MPI

        from pserver.runtime.logs import wait_until_read

        print(f"pserver-run: error: {exc}; ending the run", file=sys.stderr, flush=True)
        wait_until_read(sys.stderr)
        MPI.COMM_WORLD.Abort(3)

    def from_lost(self, source: int) -> bool:
        d = self.ctx.peers.departures
        return d is not None and d.is_lost(source)

    def drop(self, msg: MPI.Message, status: MPI.Status) -> None:
        """Receive and forget a message of a lost learner: a model snapshot is a header and
        its body on one tag, and either may be left without the other by the death (the
        first learner left sends the model from then on, ``pserver.roles.allreduce``)."""
        data = bytearray(status.Get_count(MPI.BYTE))
        try:
            msg.Recv([data, MPI.BYTE])
        except MPI.Exception as e:
            self.lost_in_transit(e, status.Get_source())

    def lost_in_transit(self, error: Exception, source: int) -> None:
        """A message whose sender was a learner that died before it was all sent (issue 22):
        dropped, as the rest of its unsent rows are; any other MPI error ends the job."""
        d, peers = self.ctx.peers.departures, self.ctx.peers
        if not peers.absorb(error, self.ctx.log) or d is None or not d.is_lost(source):
            raise peers.lost(f"a report from rank {source}", error) from error
        self.ctx.log.info("a report from %s lost with it", peers.name(source))
        self.losses.take(self.live)

    def on_records(self, msg: MPI.Message, status: MPI.Status) -> None:
        source = status.Get_source()
        data = bytearray(status.Get_count(MPI.BYTE))
        try:
            msg.Recv([data, MPI.BYTE])
        except MPI.Exception as e:
            if not self.dead_sender(source, e):
                raise
            return  # its rows die with it
        self.ctx.peers.note(source, "RECORDS")
        rows, clocks, dropped = decode(data)
        self.losses.steps(rows)
        for group, cols in rows.items():
            self.writer.append(group, **cols)  # typed by the dump schema (pserver.dump.schema)
        if clocks:
            self.writer.append_clocks("updates", "vector_clock", clocks)
        if dropped and dropped != self.dropped.get(source):  # counts are cumulative
            self.dropped[source] = dropped
            self.writer.set_attrs(
                "/",
                dropped_records={str(r): g for r, g in sorted(self.dropped.items())},
                dropped_records_total=sum(sum(g.values()) for g in self.dropped.values()),
            )
        # σ of every applied contribution, whatever the strategy: the dump's ``staleness`` rows,
        # the record that summary, compare, plot, export and read_frames read (docs/stats.md)
        sigma = rows.get("staleness", {}).get("staleness")
        if sigma:
            self.sigma_sum += sum(sigma)
            self.sigma_n += len(sigma)
            self.sigma_max = max(self.sigma_max, max(sigma))
        self.outputs.rows(rows, self.ctx.now(), self.sigma())

    def on_model(self, msg: MPI.Message, status: MPI.Status) -> None:
        source = status.Get_source()
        try:
            msg.Recv(self.hbuf[0])
        except MPI.Exception as e:
            if not self.dead_sender(source, e):
                raise
            return  # its snapshot is lost
        h = Header.unpack(self.hbuf[0])
        self.ctx.peers.note(source, h)
        epoch, b = model_epoch(h.aux), self.ctx.blocks[h.block]
        if epoch not in self.models:
            self.models[epoch] = (np.empty(self.ctx.model.n_params, self.ctx.model.dtype), set(), 0)
        w, got, ts = self.models[epoch]
        try:
            self.comm.Recv(w[b.start : b.stop], source, Tag.MODEL)
        except MPI.Exception as e:
            # the learner reporting the learners' average model (learners-only runs) died
            # between the header and the model: this snapshot is lost (an epoch left
            # untested is a skipped test at the end), the run goes on
            if not self.dead_sender(source, e):
                raise
            if not got:
                del self.models[epoch]
            return
        got.add(b.index)
        for older in [e for e, (_, blocks, _) in self.models.items() if e < epoch]:
            if b.index not in self.models[older][1]:  # its snapshot of b was skipped
                self.skip(older, len(self.models.pop(older)[1]))
        self.models[epoch] = (w, got, max(ts, h.timestamp))
        if len(got) == len(self.ctx.blocks):
            del self.models[epoch]
            self.tested.add(epoch)
            self.test(epoch, w, max(ts, h.timestamp))
            self.keep_model(epoch, w, max(ts, h.timestamp))

    def dead_sender(self, source: int, error: MPI.Exception) -> bool:
        """Issue 22 (Open MPI's ULFM): whether ``error`` receiving a message from ``source``
        is a lost learner's — its failure (acknowledged here), or a message of a learner
        already lost that arrived cut (seen: a model whose header was dropped with the dead
        rank, matched where a header was expected, MPI_ERR_TRUNCATE). Its data are lost."""
        d = self.ctx.peers.departures
        if d is None:
            return False
        if is_failure(error):
            return self.ctx.peers.absorb(error, self.ctx.log)
        return d.is_lost(source)

    def keep_model(self, epoch: int, w: np.ndarray, ts: int) -> None:
        """The newest tested model stays in the dump as ``model/weights`` (flat vector)."""
        self.writer.replace_dataset("model/weights", w, epoch=epoch, timestamp=ts)

    def test(self, epoch: int, w: np.ndarray, ts: int) -> None:
        ds = self.ctx.dataset
        t = time.perf_counter()
        loss, error = self.ctx.model.evaluate(w, ds.X_test, ds.y_test)
        now = self.ctx.now()
        samples = epoch * self.ctx.train_size
        self.writer.append(
            "test",
            epoch=np.array([epoch], np.float64),
            time=np.array([now]),
            samples=np.array([samples], np.int64),
            timestamp=np.array([ts], np.int64),
            loss=np.array([loss]),
            error=np.array([error]),
        )
        self.writer.maybe_flush()  # a flush per test would rewrite the dump every epoch
        self.outputs.tested(epoch, loss, error, now, time.perf_counter() - t, self.sigma())

    def sigma(self) -> tuple[float, int, int]:
        """Σσ, the count and max σ over the ``staleness`` rows received so far."""
        return self.sigma_sum, self.sigma_n, self.sigma_max

    def sigma_text(self) -> str:
        """⟨σ⟩ and max σ over the ``staleness`` rows received so far (none yet: no figure)."""
        return sigma_text(*self.sigma())

    def final_line(self) -> None:
        """The run's staleness once every rank's last rows are in: the number ``pserver-stats
        summary`` (its ``staleness`` block) and ``compare`` show for this dump."""
        if self.cfg.stats.progress:
            self.ctx.log.info(
                "staleness over the run  %s  over %d applied contributions",
                self.sigma_text(),
                self.sigma_n,
            )

    def skip(self, epoch: int, blocks: int) -> None:
        """Record that ``epoch`` was not tested: a shard skipped its snapshot (see module doc)."""
        if epoch in self.skipped or epoch in self.tested:
            return
        self.skipped.add(epoch)
        self.writer.append(
            "skipped_tests",
            epoch=np.array([epoch], np.float64),
            time=np.array([self.ctx.now()]),
            blocks_received=np.array([blocks], np.int32),
        )

    def skip_untested(self) -> None:
        """At the end: every epoch due a test that got none is a ``skipped_tests`` row."""
        epochs, every = self.cfg.run.epochs, self.cfg.stats.test_every
        # stopped by a signal, or paused for a periodic checkpoint (its final epoch not
        # reached): the epochs not reached are not due yet
        paused = self.cfg.run.checkpoint_interval > 0 and self.cfg.run.epochs not in self.tested
        if STOP.requested or paused:
            epochs = max(self.tested | self.skipped | set(self.models), default=0)
        due = [e for e in range(1, epochs + 1) if e % every == 0 or e == self.cfg.run.epochs]
        due = [e for e in due if e not in self.tested]
        for epoch in due:
            got = self.models.pop(epoch, (None, set(), 0))[1]
            self.skip(epoch, len(got))
        if self.skipped:
            self.ctx.log.warning(
                "tests of epochs %s skipped: their model snapshots found the previous one "
                "still on its way here (skipped_tests)",
                sorted(self.skipped),
            )

    def on_bye(self, msg: MPI.Message, status: MPI.Status) -> None:
        source = status.Get_source()
        msg.Recv(self.hbuf[0])
        self.ctx.peers.note(source, Header.unpack(self.hbuf[0]))
        ring(source)  # its RecordBuffer.bye may sleep on its doorbell
        self.live.discard(source)


def node_cpu_seconds() -> float | None:
    """CPU seconds the node's cores have been busy since boot (``/proc/stat``: all but idle
    and iowait), for ``node_cpu_time``; None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:8]]
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def node_cpu_attr(start: float | None) -> dict[str, float]:
    """``node_cpu_time``: the node's busy CPU seconds over the run, every process's (this
    job's and any other's): ``pserver-sim --calibrate`` takes this job's own from it to find
    the cores other jobs held (docs/stats.md)."""
    end = node_cpu_seconds()
    return {} if start is None or end is None else {"node_cpu_time": end - start}


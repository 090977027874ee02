"""Statistics server: collects what every rank reports, tests the model at epoch ends, and
writes the HDF5 dump as the run goes (flushed every ``stats.flush_interval`` seconds)."""

from __future__ import annotations

import socket
import time
from datetime import datetime, timezone
from typing import Any

import numpy as np
from mpi4py import MPI

from pserver import __version__
from pserver.context import Context
from pserver.stats.writer import StatsWriter
from pserver.wire import Header, Tag, WireError, header_buffer

#: dtype of every column the ranks report (schema in docs/stats.md)
INT32 = {
    "shard", "learner", "staleness", "n_gradients", "block", "dropped_blocks", "aggregator",
    "rank",
}
INT64 = {
    "timestamp",
    "update",
    "step",
    "samples",
    "minibatches",
    "updates",
    "dropped_after_stop",
    "bytes_in",
    "bytes_out",
    "applied",
    "dropped",
    "size",
    "request",
    "relayed_bytes",
}


def column(name: str, values: list[Any]) -> np.ndarray:
    dtype = np.int32 if name in INT32 else np.int64 if name in INT64 else np.float64
    return np.asarray(values, dtype=dtype)


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
        self.writer = StatsWriter(ctx.dump_path, self.attrs(), self.cfg.stats.flush_interval)
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
        }

    def run(self) -> None:
        self.ctx.log.info("writing %s", self.ctx.dump_path)
        with self.writer:
            while self.live:
                # a matched probe (Waiter.probe): each handler receives the message it is given
                msg, status = self.waiter.probe(
                    self.comm, lambda: f"reports from ranks {sorted(self.live)}"
                )
                tag = status.Get_tag()
                handler = self.handlers.get(tag)  # type: ignore[call-overload]
                if handler is None:
                    raise WireError(
                        f"stats server got unknown tag {tag} from {status.Get_source()}"
                    )
                handler(msg, status.Get_source())
                self.writer.maybe_flush()
            self.writer.set_attrs(
                "/",
                finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                wall_time=self.ctx.now(),
            )
        self.ctx.log.info("dump written to %s", self.ctx.dump_path)

    def on_records(self, msg: MPI.Message, source: int) -> None:
        rows = msg.recv()
        self.ctx.peers.note(source, "RECORDS")
        clocks = rows.pop("__clocks__", None)
        for group, cols in rows.items():
            self.writer.append(group, **{k: column(k, v) for k, v in cols.items()})
        if clocks:
            self.writer.append_clocks("updates", "vector_clock", clocks)
        sigma = rows.get("gradients", {}).get("staleness")
        if sigma:
            self.sigma_sum += sum(sigma)
            self.sigma_n += len(sigma)
            self.sigma_max = max(self.sigma_max, max(sigma))

    def on_model(self, msg: MPI.Message, source: int) -> None:
        msg.Recv(self.hbuf[0])
        h = Header.unpack(self.hbuf[0])
        self.ctx.peers.note(source, h)
        epoch, b = h.aux, self.ctx.blocks[h.block]
        if epoch not in self.models:
            self.models[epoch] = (np.empty(self.ctx.model.n_params, self.ctx.model.dtype), set(), 0)
        w, got, ts = self.models[epoch]
        self.comm.Recv(w[b.start : b.stop], source, Tag.MODEL)
        got.add(b.index)
        self.models[epoch] = (w, got, max(ts, h.timestamp))
        if len(got) == len(self.ctx.blocks):
            del self.models[epoch]
            self.test(epoch, w, max(ts, h.timestamp))
            self.keep_model(epoch, w, max(ts, h.timestamp))

    def keep_model(self, epoch: int, w: np.ndarray, ts: int) -> None:
        """The newest tested model stays in the dump as ``model/weights`` (flat vector)."""
        f = self.writer.file
        if "model/weights" in f:
            del f["model/weights"]
        d = f.create_dataset("model/weights", data=w)
        d.attrs.update(epoch=epoch, timestamp=ts)

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
        self.writer.flush()
        mean = self.sigma_sum / self.sigma_n if self.sigma_n else 0.0
        if self.cfg.stats.progress:
            self.ctx.log.info(
                "epoch %d/%d  test error %.2f%%  loss %.4f  <sigma> %.2f  max sigma %d  "
                "%.0f samples/s  t=%.1fs  (test took %.2fs)",
                epoch,
                self.cfg.run.epochs,
                100 * error,
                loss,
                mean,
                self.sigma_max,
                samples / max(now, 1e-9),
                now,
                time.perf_counter() - t,
            )

    def on_bye(self, msg: MPI.Message, source: int) -> None:
        msg.Recv(self.hbuf[0])
        self.ctx.peers.note(source, Header.unpack(self.hbuf[0]))
        self.live.discard(source)

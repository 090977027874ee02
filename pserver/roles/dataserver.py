"""Data server: hands out minibatches of the training set in the order of one seeded stream.

A single ``BatchSampler`` serves every learner in request order, so with one learner the
sequence of minibatches is exactly that of a serial run with the same seed.

In the parameter-server families the shards decide when training is over (``pserver.epochs``);
a learners-only run has no shard, so the data server, which counts every minibatch, decides
(``run_over``) and a learners-only strategy answers the requests after the last one with a stop.
"""

from __future__ import annotations

import numpy as np

from pserver.comm.inbox import Inbox
from pserver.context import Context
from pserver.epochs import EpochCounter
from pserver.wire import Tag, WireError


class DataServer:
    def __init__(self, ctx: Context) -> None:
        from learners.data import BatchSampler

        self.ctx = ctx
        self.comm = ctx.channels.io
        self.waiter = ctx.waiter()
        ds, batch = ctx.dataset, ctx.cfg.data.batch_size
        self.X, self.y = ds.X_train, ds.y_train
        self.sampler = BatchSampler(len(ds.y_train), batch, ctx.cfg.run.seed)
        self.xbuf = np.empty((batch, ds.n_features), dtype=np.float32)
        self.ybuf = np.empty(batch, dtype=np.int64)
        self.live = set(ctx.layout.learners)
        self.served = 0
        self.epochs = EpochCounter.from_config(ctx.cfg, ctx.train_size)

    def run(self) -> None:
        inbox = Inbox(self.comm, self.waiter, self.ctx.peers)
        while self.live:
            h = inbox.next(lambda: f"minibatch requests from learners {sorted(self.live)}")
            assert h is not None  # no other way for this wait to end
            if h.kind is Tag.DATA_REQ:
                self.serve(h.sender)
            elif h.kind is Tag.BYE:
                self.live.discard(h.sender)
            else:
                raise WireError(f"data server got unexpected {h} from rank {h.sender}")
        self.ctx.log.debug("served %d minibatches", self.served)

    def serve(self, dest: int) -> None:
        idx = self.sampler.next()
        np.take(self.X, idx, axis=0, out=self.xbuf)
        np.take(self.y, idx, out=self.ybuf)
        reqs = [
            self.comm.Isend(self.xbuf, dest, Tag.DATA_X),
            self.comm.Isend(self.ybuf, dest, Tag.DATA_Y),
        ]
        self.waiter.waitall(reqs, f"minibatch delivery to rank {dest}")
        self.served += 1

    def run_over(self) -> bool:
        """Whether the minibatches served so far complete ``run.epochs`` (learners-only runs)."""
        return self.epochs.last_minibatch(self.served)

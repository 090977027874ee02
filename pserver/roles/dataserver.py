"""Data server: hands out minibatches of the training set in the order of one seeded stream.

A single ``BatchSampler`` serves every learner in request order, so with one learner the
sequence of minibatches is exactly that of a serial run with the same seed.

In the parameter-server families the shards decide when training is over
(``pserver.protocols.epochs``)
and every request is served. A learners-only run has no shard, so the data server, which
counts every minibatch, decides (``pserver.protocols.lockstep.DataQuota``): a request past the
quota is
answered with a stop, an empty minibatch (zero features, zero labels) on the same two tags, so
the learner's receives match it as they match a minibatch. Lockstep strategies (SYNC, HYBRID)
get ``S`` minibatches per learner, exactly the steps each takes (a learner that prefetched
ahead cannot take a slower one's last), learner i's k-th being draw kλ + i of the stream
(``LockstepDraws``: the run does not depend on arrival order); free-running ones (ADPSGD)
share ``M`` in request order.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pserver.ckpt.files import State
from pserver.ckpt.records.quota import quota_state, restore_quota
from pserver.comm.inbox import Inbox
from pserver.comm.wire import Tag, WireError, bye_consumed
from pserver.plan.config import Config
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.lockstep import FREE, LOCKSTEP, DataQuota, LockstepDraws, total_minibatches
from pserver.runtime.context import Context
from pserver.strategies import lookup

NO_X = np.empty((0, 0), dtype=np.float32)  # the stop: an empty minibatch
NO_Y = np.empty(0, dtype=np.int64)


def quota(cfg: Config, train_size: int, n_learners: int) -> DataQuota | None:
    """The learners-only strategies' quota; None (serve every request) with server shards."""
    s = lookup(cfg.protocol.name)
    if s.ranks.servers:
        return None
    kind = LOCKSTEP if s.lockstep else FREE
    return DataQuota(kind, total_minibatches(cfg, train_size), n_learners)


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
        self.fingerprint: str | None = None  # SHA-256 of X, y: computed at the first checkpoint
        self.epochs = EpochCounter.from_config(ctx.cfg, ctx.train_size)
        self.quota = quota(ctx.cfg, ctx.train_size, len(ctx.layout.learners))
        lockstep = self.quota is not None and self.quota.kind == LOCKSTEP
        n = len(ctx.layout.learners)
        self.draws = LockstepDraws(n, self.sampler.next) if lockstep else None
        self.stopped = 0  # requests answered with a stop
        # the checkpoint's cut (pserver.ckpt.drivers.end): per learner, the minibatches served
        # (serial number, indices) that it may not have computed on yet (its prefetch), and
        # those it reported computed on when it said goodbye
        self.recent: dict[int, deque[tuple[int, np.ndarray]]] = {
            r: deque(maxlen=ctx.cfg.data.prefetch + 2) for r in self.live
        }
        self.count = dict.fromkeys(self.live, 0)
        self.consumed: dict[int, int] = {}
        self.replay: deque[np.ndarray] = deque()  # resumed: served again first, in order
        if ctx.resume is not None:
            self.restore(ctx.resume.state)

    def run(self) -> None:
        inbox = Inbox(self.comm, self.waiter, self.ctx.peers)
        while self.live:
            h = inbox.next(lambda: f"minibatch requests from learners {sorted(self.live)}",
                           also=lambda: bool(self.lost()))
            self.live -= set(self.lost())  # died (ULFM): asks for nothing more
            if h is None:
                continue
            if h.kind is Tag.DATA_REQ:
                self.serve(h.sender)
            elif h.kind is Tag.BYE:
                self.live.discard(h.sender)
                self.consumed[h.sender] = bye_consumed(h.aux)
            else:
                raise WireError(f"data server got unexpected {h} from rank {h.sender}")
        self.ctx.log.debug("served %d minibatches, %d stops", self.served, self.stopped)

    def lost(self) -> list[int]:
        """Learners of ``live`` that died (``pserver.comm.departures``; none without ULFM)."""
        d = self.ctx.peers.departures
        return [] if d is None else sorted(self.live & d.lost().keys())

    def serve(self, dest: int) -> None:
        learner = self.ctx.layout.index(dest)
        if self.quota is not None and not self.quota.allows(learner):
            self.send(NO_X, NO_Y, dest)
            self.stopped += 1
            return
        if self.draws is not None:  # learner i's k-th minibatch: draw kλ + i
            idx = self.draws.take(learner, self.quota.served[learner] - 1)
        else:
            idx = self.replay.popleft() if self.replay else self.sampler.next()
        self.served_to(dest, idx)
        np.take(self.X, idx, axis=0, out=self.xbuf)
        np.take(self.y, idx, out=self.ybuf)
        self.send(self.xbuf, self.ybuf, dest)
        self.served += 1

    def send(self, X: np.ndarray, y: np.ndarray, dest: int) -> None:
        reqs = [self.comm.Isend(X, dest, Tag.DATA_X), self.comm.Isend(y, dest, Tag.DATA_Y)]
        self.waiter.waitall(reqs, f"minibatch delivery to rank {dest}")

    def served_to(self, dest: int, idx: np.ndarray) -> None:
        if dest in self.count:
            self.recent[dest].append((self.served, idx))
            self.count[dest] += 1

    # -- checkpoints (pserver.ckpt.drivers.end) ----------------------------------------------------

    def unconsumed(self) -> list[np.ndarray]:
        """The minibatches served that no learner computed on (prefetched when it stopped),
        in the order they were served, then those still waiting to be replayed: with λ = 1
        the resumed stream is exactly the uninterrupted one."""
        left: list[tuple[int, np.ndarray]] = []
        for r, recent in self.recent.items():
            consumed = self.consumed.get(r, -1)
            n = self.count[r] - consumed if consumed >= 0 else 0
            left.extend(list(recent)[len(recent) - n :] if n > 0 else [])
        return [idx for _, idx in sorted(left, key=lambda e: e[0])] + list(self.replay)

    def state(self) -> State:
        """The sampler and the draws to replay, with the training data's fingerprint, checked
        on resume (``pserver.ckpt.resume.check_data``)."""
        state = self.stream_state()
        if self.fingerprint is None:  # once per run: the data do not change during it
            from pserver.ckpt.resume import data_fingerprint

            self.fingerprint = data_fingerprint(self.X, self.y)
        state.attrs["data_sha256"] = self.fingerprint
        return state

    def stream_state(self) -> State:
        if self.draws is not None:  # SYNC, HYBRID: the draws no learner computed on
            from pserver.ckpt.drivers.draws import draws_state

            return draws_state(self)
        attrs, perm = self.sampler.state()
        replay = self.unconsumed()
        batch = self.ctx.cfg.data.batch_size
        arrays = {
            "perm": perm,
            "replay": np.array(replay, np.int64).reshape(len(replay), batch),
        }
        extra = {}
        if self.quota is not None:  # learners-only: what each computed on (quota_ckpt)
            index = self.ctx.layout.index
            extra["quota"] = quota_state(self.quota, self.count, self.consumed, index)
        return State(arrays, {"role": "data", "sampler": attrs, **extra})

    def restore(self, state: State) -> None:
        if self.draws is not None:
            from pserver.ckpt.drivers.draws import restore_draws

            restore_draws(self, state)
            return
        self.sampler.restore(state.attrs["sampler"], state.arrays["perm"])
        self.replay.extend(np.array(row) for row in state.arrays["replay"])
        if self.quota is not None and "quota" in state.attrs:
            restore_quota(self.quota, state.attrs["quota"])

    def run_over(self) -> bool:
        """Whether the minibatches served so far complete ``run.epochs`` (learners-only runs)."""
        return self.epochs.last_minibatch(self.served)

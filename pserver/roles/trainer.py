"""The learner's loop (Rudra §III-B): fetch a minibatch, compute loss and gradient, exchange.

The trainer knows nothing of servers. Its exchange decides what happens to the weights:
``weights()`` gives the model to compute the next minibatch on (None once the run is over),
``gradient_buffer()`` lends the array the gradient is computed into, ``gradient(g)`` takes it,
``done()`` drains what the exchange still has to deliver (returning the seconds blocked on the
last push), ``close()`` stops its progress (also after an error) and ``finish()`` says goodbye.
An exchange that writes rows of its own (the learners-only ones: ``exchanges``, ``drift``) has
``attach(records)``, called once with the trainer's record buffer.
The trainer owns the rest: the minibatches (from the prefetcher), the non-finite check, the
injected faults and delays (``inject.*``), the timings and the ``train`` and ``learners`` rows.
"""

from __future__ import annotations

import math
import os
import signal
import time
from typing import TYPE_CHECKING, Any

from pserver.comm.wire import Header, Tag, header_buffer
from pserver.errors import diverged, nonfinite_gradient
from pserver.plan.config import inject_plan
from pserver.roles.exchange import Exchange

if TYPE_CHECKING:
    from pserver.roles.prefetch import Prefetcher
    from pserver.runtime.context import Context


def kill_self(log: Any, step: int) -> None:
    """``inject.fail_kill``: end this process as a node failure would (SIGKILL), after a log
    line that says when; the survivors see a lost learner (docs/launching.md, *Lost
    learners*)."""
    log.warning("inject.fail_kill: killing this learner (pid %d) at step %d", os.getpid(), step)
    for handler in log.handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Trainer:
    def __init__(self, ctx: Context, exchange: Exchange, prefetch: Prefetcher) -> None:
        self.ctx, self.cfg, self.xp = ctx, ctx.cfg, ctx.xp
        self.ex, self.prefetch = exchange, prefetch
        self.index = ctx.layout.index(ctx.rank)
        self.records = ctx.records()
        exchange.attach(self.records)  # its rows, if any, go with ours in one stream
        self.model = ctx.model
        self.inject = inject_plan(self.cfg)
        self.slow = self.index == self.cfg.inject.slow_learner
        self.steps = 0
        self.compute_time = self.pull_time = self.push_time = 0.0
        self.consumed = 0  # minibatches of this run's stream computed on (the data server's cut)
        self.stopped_early = False  # a signal ended the run before the shards did
        # a periodic checkpoint (pserver.ckpt.drivers.periodic): pause at the first step
        # boundary from this time on (ctx.now() seconds), as a signal would stop the run
        interval = self.cfg.run.checkpoint_interval
        self.pause_at = ctx.now() + interval if interval > 0 else math.inf
        self.paused = False
        exchange.interrupt = self.interrupt  # it may leave a pull for a stop (iteration rule)
        if getattr(ctx, "resume", None) is not None:
            self.restore(ctx.resume.state)

    def run(self) -> None:
        try:
            while not self.stop_requested() and self.step():
                self.records.maybe_send()
            self.push_time += self.ex.done()
        finally:
            self.ex.close()
            self.prefetch.close()
        if self.stopped_early:  # its finish may be a cut of its own (ADPSGD)
            self.ex.signalled()
        self.ex.finish()
        self.prefetch.bye(self.consumed)
        self.report()

    def stop_requested(self) -> bool:
        """SIGTERM/SIGINT seen (``pserver.runtime.signals``) or a periodic checkpoint due
        (``pause_at``): stop at this step boundary, where every push of the last step is sent
        and no minibatch is half computed: the consistent cut."""
        from pserver.runtime.signals import STOP

        if self.ex.votes_on_stop:  # lockstep learners stop at one boundary, the same on all
            vote = self.ex.vote
            if vote is not None:  # (pserver.roles.stop_vote): a due pause is a vote too
                vote.pause_wanted = self.pause_due()
            if self.ex.stop_agreed():
                self.paused = vote.paused
                self.stopped_early = not self.paused
        elif STOP.requested:
            self.stopped_early = True
        elif self.pause_due():
            self.paused = True
        return self.stopped_early or self.paused

    def interrupt(self) -> bool:
        """Whether a learner waiting in a pull should leave it and stop where it is, at the
        step boundary after its last push (the iteration rule's cut,
        pserver.ckpt.records.partial_pull):
        a signal, or a periodic pause that is due. In a part's first pull (no step yet) only
        one interval after the pause was due, so a part still makes progress whenever a pull
        is quicker than ``run.checkpoint_interval``; a learner left alone in a round by the
        others' pause still leaves it."""
        from pserver.runtime.signals import STOP

        if STOP.requested:
            self.stopped_early = True
            return True
        now, interval = self.ctx.now(), self.cfg.run.checkpoint_interval
        if self.pause_at < math.inf and now >= self.pause_at + (0 if self.consumed else interval):
            self.paused = True
            return True
        return False

    def pause_due(self) -> bool:
        """A periodic checkpoint is due, and this part of the run took a step at least (so
        every part makes progress, however short ``run.checkpoint_interval``)."""
        return self.pause_at < math.inf and self.consumed > 0 and self.ctx.now() >= self.pause_at

    # -- checkpoints (pserver.ckpt.drivers.end) ---------------------------------------------------

    def state(self) -> Any:
        """The step count and the exchange's own state (``state()``: a strategy's local
        optimizer, its model; the PS exchanges keep nothing that the shards do not hold)."""
        from pserver.ckpt.files import State

        ex = self.ex.state()
        attrs = {"role": "learner", "steps": self.steps, "exchange": ex.attrs}
        return State({f"exchange.{k}": v for k, v in ex.arrays.items()}, attrs)

    def restore(self, state: Any) -> None:
        from pserver.ckpt.files import State

        self.steps = int(state.attrs["steps"])
        n = len("exchange.")
        arrays = {k[n:]: v for k, v in state.arrays.items() if k.startswith("exchange.")}
        self.ex.restore(State(arrays, state.attrs.get("exchange", {})))

    def step(self) -> bool:
        t0 = time.perf_counter()
        w = self.ex.weights()
        if w is None:
            return False
        pull = time.perf_counter() - t0
        if self.ex.freeze_after_weights:
            self.freeze()
        t1 = time.perf_counter()
        batch = self.prefetch.get()
        if batch is None:  # learners-only: the data server served the run's last minibatch
            return False
        X, y = batch
        self.consumed += 1
        t2 = time.perf_counter()
        grad = self.ex.gradient_buffer()
        self.compute(w, X, y, grad)
        t3 = time.perf_counter()
        self.prefetch.release()
        self.ex.gradient(grad)
        push = time.perf_counter() - t3
        if not self.ex.freeze_after_weights:
            self.freeze()
        self.account(pull, t2 - t1, t3 - t2, push)
        return True

    def account(self, pull: float, fetch: float, compute: float, push: float) -> None:
        """Add one minibatch's seconds to the totals and write its ``train`` row."""
        self.compute_time += compute
        self.pull_time += pull
        self.push_time += push
        stale, dropped = self.ex.staleness()
        self.records.add(
            "train",
            learner=self.index,
            step=self.steps,
            time=self.ctx.now(),
            loss=self.loss,
            error=self.error,
            compute_time=compute,
            wait_time=pull + fetch + push,
            pull_time=pull,
            push_time=push,
            stale_fraction=stale,
            dropped_blocks=dropped,
        )
        self.steps += 1

    def compute(self, w: Any, X: Any, y: Any, grad: Any) -> None:
        if self.index == self.cfg.inject.fail_learner and self.steps == self.cfg.inject.fail_step:
            if self.cfg.inject.fail_kill:  # a lost learner: no message, no goodbye, no flush
                kill_self(self.ctx.log, self.steps)
            raise RuntimeError(f"failure injected at step {self.steps} (inject.fail_learner)")
        started = time.perf_counter()
        self.loss, self.error = self.model.loss_grad(w, X, y, grad)
        if not math.isfinite(self.loss):  # NaN or inf weights (or lr too large): stop now
            bad = int((~self.xp.isfinite(w)).sum())
            raise diverged(self.loss, self.steps, self.ex.have, bad, self.cfg.optim.lr)
        self.check_gradient(w, grad)  # a finite loss can still come with an infinite gradient
        self.ctx.backend.synchronize()
        # emulated accelerator work (the CPU idles), growing with the minibatch's samples
        extra = self.inject.compute_time_for(self.index, len(y))
        if self.slow:  # an injected straggler also takes longer for its real compute
            extra += (self.cfg.inject.learner_factor - 1.0) * (time.perf_counter() - started)
        if extra > 0.0:
            time.sleep(extra)

    def check_gradient(self, w: Any, grad: Any) -> None:
        """Refuse a gradient with a NaN or infinite value before the exchange sees it. One sum
        in the gradient's own dtype is the test: any NaN or Inf makes it non-finite. A sum of
        finite values that overflows is non-finite too, and the exact count below then finds
        nothing bad. (A float64 sum of float32 values converts every element first: about twice
        the CPU of the dtype's own sum, as much as the null model's whole step;
        docs/performance.md, *The server path at the memory limit*.)"""
        if math.isfinite(float(grad.sum())):
            return
        bad = ~self.xp.isfinite(grad)
        n_bad = int(bad.sum())
        if n_bad == 0:  # finite gradients whose sum overflowed the dtype: only huge
            return
        first = int(self.xp.argmax(bad))
        bad_w = int((~self.xp.isfinite(w)).sum())
        raise nonfinite_gradient(
            self.index, self.steps, self.consumed, n_bad, int(grad.size), first, bad_w,
            self.cfg.optim.lr,
        )

    def freeze(self) -> None:
        """``inject.freeze_*``: stop without calling MPI, weights of our pull on their way."""
        seconds = self.inject.freeze_for(self.index, self.steps)
        if seconds > 0.0:
            time.sleep(seconds)

    def report(self) -> None:
        """The ``learners`` row, then the last statistics and the goodbye to their server."""
        busy = self.compute_time + self.pull_time + self.push_time
        self.records.add(
            "learners",
            learner=self.index,
            minibatches=self.steps,
            compute_time=self.compute_time,
            wait_time=self.ex.waiter.waited + self.prefetch.waited,
            samples=self.steps * self.cfg.data.batch_size,
            pull_time=self.pull_time,
            push_time=self.push_time,
            relayed_bytes=self.ex.relayed_bytes,
            # Rudra Table I: the share of a learner's time spent computing, not blocked
            overlap=self.compute_time / max(busy, 1e-12),
            **self.records.usage(),
        )
        waiter = self.ex.waiter
        self.records.close(waiter)
        bye = Header(Tag.BYE, -1, -1, self.ctx.rank).pack(header_buffer()[0])
        self.records.bye(bye, Tag.BYE, waiter)

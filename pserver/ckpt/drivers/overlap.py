"""Sending again, on resume, what an overlapped learner's cut left undone.

The state itself (saved, restored, checked) is :mod:`pserver.ckpt.records.pipeline`'s; this is the
part
that sends messages, run by ``OverlapExchange.begin`` before the first minibatch of a run
resumed with a pipeline.
"""

from __future__ import annotations

from typing import Any


def resend(ex: Any) -> None:
    """Before the first minibatch of a resumed run (async, n-softsync): send the requests the
    shards answered STOP at the cut and the pushes they dropped, in their original order.

    A request goes just before the first dropped push it preceded (its ``covered`` count), the
    others after the last; a dropped push goes with the timestamps it was first sent with, from
    the gradient buffer it was computed in. Each push is delivered before the next one reuses
    a buffer (``OverlapExchange.gradient`` keeps the same rule). Liveness: the only wait is
    for a push's delivery, which its shard receives as any other (it reads every header until
    every learner said goodbye, and this learner has not); the requests sent are answered as
    the uninterrupted run's were (``pserver.protocols.inflight``, point 3)."""
    stopped, drops = ex.replay
    ex.replay = ([], [])
    w = ex.window
    pending = sorted(b for b in stopped if b in ex.by_index)
    for p, ts, g in drops:
        with ex.lock:
            for b in [b for b in pending if w is None or w.covered[b] <= p]:
                ex.ask(ex.by_index[b])
                pending.remove(b)
            buf = ex.grads[p % 2]
            ex.ctx.backend.copy_from_host(g, buf)
            held = dict(ex.have)
            for b, t in sorted(ts.items()):
                ex.have[b] = t  # the timestamp it was computed from (staleness, S̄)
                ex.link.push(ex.by_index[b], buf)
            ex.have.update(held)
            ex.recent.append((p, dict(ts)))  # dropped again if the shards are still done
        ex.wait(lambda: not ex.link.pushing, "the dropped pushes sent again")
    with ex.lock:
        for b in pending:
            ex.ask(ex.by_index[b])

"""How far an overlapped learner may run ahead of its own gradients (``comm.max_inflight``).

A Rudra-adv* learner (``comm.mode`` thread | nonblocking) computes the next minibatch while the
previous push travels. Without a bound it computes on w0 for as long as the server is busy (its
first update imports SciPy: 1-3 s), and under async or n-softsync it keeps pushing gradients
from weights that contain none of its recent ones: the server's queue grows and staleness with
it (async, λ = 4: ⟨σ⟩ 6.8-10.3 against 2.9 blocking, max σ up to 134).

The bound: before it computes gradient k, a learner must hold a model that *acknowledges* all
but at most ``limit - 1`` of its k earlier pushes, so at most ``limit`` of its gradients are
ever pushed but unacknowledged. A push is acknowledged by the answer to a pull request the
learner sent after it, once that answer is installed. Headers from one rank to another on one
communicator are not overtaken (MPI's ordering rule), and a shard takes a push before it reads
the pull that followed it, so the answer comes from weights that

* contain the gradient, under async (every gradient is its own update: Rudra eq. 4), or
* contain it or hold it in the aggregate that the next update applies, under n-softsync with
  c = ⌊λ/n⌋ > 1 (eq. 5): one update of slack.

Staleness (Rudra §III-A): the shard's backlog of pushed-but-untaken gradients holds at most
``limit`` per learner, λ·limit in all, i.e. λ·limit/c = n·limit updates. With ``limit = 2``
(Rudra-adv*'s double buffer: one gradient travels while the next is computed) that is the
paper's σ ≤ 2n (Fig. 3) for the part of σ the overlap adds. The rest of σ, the updates the
others make while this learner computes, is the same as in blocking mode and has no bound
that one learner could enforce: a learner descheduled for a while misses the others' updates
in every mode. With λ = 1 nothing else updates the weights, so σ ≤ limit − 1 exactly, and
``limit = 1`` reproduces serial SGD.

Liveness (why waiting for the bound cannot deadlock):

1. A learner waits only while ``unacknowledged() >= limit >= 1``, i.e. some live block b has
   ``acked[b] < pushed``.
2. Invariant kept by the driver: every live block has a request outstanding, or an answer not
   yet installed, or a request covering every push (``covered[b] == pushed``). After each push
   the driver asks every live block that has neither an outstanding request nor an uninstalled
   answer; the others are asked again when their answer is installed (:meth:`uncovered`).
3. The requests sent under the bound ask for weights of any age (``oldest = 0``), so the rank
   asked (shard, aggregator or parent learner) answers each one as soon as it reads it —
   WEIGHTS, CURRENT or STOP — without waiting for any other learner's gradient. An injected
   reply delay is finite. So every outstanding request is answered in finite time.
4. Installing the answers sets ``acked[b] = covered[b]`` and re-asks the blocks still behind;
   after at most two rounds of answers every live block has ``acked[b] == pushed`` or is
   stopped, and the wait ends. The wait never depends on another learner's progress, so no
   cycle of waits can form.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The default bound (``comm.max_inflight = 0``): Rudra-adv*'s two gradient buffers.
AUTO_LIMIT = 2


def inflight_limit(setting: int) -> int:
    """The bound for ``comm.max_inflight = setting``: 0 is "auto" (:data:`AUTO_LIMIT`)."""
    if setting < 0:
        raise ValueError(f"comm.max_inflight must be >= 0, got {setting}")
    return setting or AUTO_LIMIT


class InflightWindow:
    """Pushes of one learner and which of them its installed model acknowledges.

    Counts, per block, the pushes sent before the block's latest pull request (``covered``),
    before the request whose answer waits to be installed (``answered``) and before the
    request whose answer was installed last (``acked``). No MPI: the learner reports each
    push, request, answer, stop and install, and asks :meth:`may_compute` before computing.
    """

    def __init__(self, limit: int, blocks: Iterable[int]) -> None:
        if limit < 1:
            raise ValueError(f"an in-flight bound needs limit >= 1, got {limit}")
        self.limit = limit
        self.pushed = 0
        self.covered = {b: 0 for b in blocks}
        self.acked = dict(self.covered)
        self.answered: dict[int, int] = {}
        self.stopped: set[int] = set()

    def push(self) -> None:
        """One gradient went out (to every live block)."""
        self.pushed += 1

    def ask(self, block: int) -> None:
        """A pull request for ``block`` went out after every push so far."""
        self.covered[block] = self.pushed

    def answer(self, block: int) -> None:
        """The answer (weights, or "yours is current") to ``block``'s request came in."""
        self.answered[block] = self.covered[block]

    def stop(self, block: int) -> None:
        """``block`` stopped: training is over for it, it holds nothing back."""
        self.stopped.add(block)
        self.answered.pop(block, None)

    def install(self) -> None:
        """The answers that came in are now the model the learner computes with."""
        for block, token in self.answered.items():
            self.acked[block] = max(self.acked[block], token)
        self.answered.clear()

    def uncovered(self) -> list[int]:
        """Live blocks with pushes that no request was sent after: ask them again."""
        return [b for b, n in self.covered.items() if b not in self.stopped and n < self.pushed]

    def unacknowledged(self) -> int:
        """Pushes the installed model does not acknowledge (0 once every block stopped)."""
        live = [n for b, n in self.acked.items() if b not in self.stopped]
        return self.pushed - min(live) if live else 0

    def may_compute(self) -> bool:
        """Whether the next gradient may be computed: it would leave ≤ ``limit`` unacknowledged."""
        return self.unacknowledged() < self.limit

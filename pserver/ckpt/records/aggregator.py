"""An aggregator's checkpoint record (``cluster.tree_fanout``), and which learners a goodbye
retires (pure: the shard's and the aggregator's rule).

An aggregator (``pserver.roles.aggregator``) holds three things between two messages: a partial
sum of its children's gradients (the round it has not relayed yet), the cached weights it
serves its children (with its long poll for newer ones out at its parent), and the children's
pulls it holds. None of them is saved: the cut drains or settles each (the aggregator's own
protocol at a cut: ``pserver.roles.aggregator``, *At a checkpoint's cut*), so an aggregator's
file holds only its byte counts (the ``aggregators`` row's counts go on over the parts of a
run) and its children (:class:`AggregatorRecord`).

**Resume.** The aggregator starts with no weights cached (timestamp −1) and holds its
children's pulls until its long poll brings the shard's checkpointed model, so no child gets the
initial w0 in its place. With λ = 1 the resumed run equals the uninterrupted one bit for bit
(one gradient per relayed sum: the sum is the gradient itself; tests/test_mpi_ckpt_tree.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pserver.ckpt.files import State
from pserver.plan.topology import Layout, Role

NOT_CACHED = -1  # a resumed aggregator's timestamp: it serves nothing before its parent answers


def subtree_learners(layout: Layout, rank: int) -> list[int]:
    """The indices of the learners below aggregator ``rank`` (pure)."""
    out = []
    for i, learner in enumerate(layout.learners):
        up = layout.parent.get(learner)
        while up is not None and up != rank:
            up = layout.parent.get(up)
        if up == rank:
            out.append(i)
    return out


def departed_learners(layout: Layout, rank: int) -> list[int]:
    """The learners a goodbye from ``rank`` retires: itself, or an aggregator's subtree."""
    if layout.role(rank) is Role.LEARNER:
        return [layout.index(rank)]
    return subtree_learners(layout, rank)


@dataclass(frozen=True)
class AggregatorRecord:
    """An aggregator's checkpoint: its byte counts and its children (the tree's layout,
    checked by ``pserver.ckpt.resume.check_state``)."""

    children: tuple[int, ...]
    bytes_in: int
    bytes_out: int

    def to_state(self) -> State:
        attrs = {
            "role": "aggregator",
            "children": list(self.children),  # checked on resume
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }
        return State({}, attrs)

    @classmethod
    def from_state(cls, saved: State) -> AggregatorRecord:
        """The record of a state read (and validated) by ``pserver.ckpt.files``."""
        a = saved.attrs
        children = tuple(int(c) for c in a.get("children", ()))
        return cls(children, int(a.get("bytes_in", 0)), int(a.get("bytes_out", 0)))

"""The aggregator tree at a checkpoint's cut (``cluster.tree_fanout``): what an aggregator
drains, what it tells its parent, and what it saves.

An aggregator (``pserver.roles.aggregator``) holds three things between two messages: a partial
sum of its children's gradients (the round it has not relayed yet), the cached weights it
serves its children (with its long poll for newer ones out at its parent), and the children's
pulls it holds. None of them is saved: the cut drains or settles each, so an aggregator's file
holds only its byte counts (the ``aggregators`` row's counts go on over the parts of a run).

**No gradient lost or applied twice.** A learner stops at a step boundary (a signal, a periodic
pause: ``pserver.roles.trainer``) with every push sent and says goodbye to its aggregator after
the answers to its last pulls. An aggregator relays a round once every live child has pushed;
a goodbye shrinks the live set, so the round that waited for the child that left is relayed at
its goodbye (``Aggregator.on_bye``), and when the last child leaves every partial sum is relayed
(an empty live set is a subset of any round). The aggregator's loop ends only then, and its
goodbye to its parent goes on the control communicator after the pushes it relayed: the parent
reads a sender's headers in order, so it has every relayed gradient before it reads the
goodbye, and a shard's loop ends only after every top aggregator's goodbye. So when a shard
saves, every gradient a learner computed on is in the shard's weights, in a round it still has
open (closed on the last goodbye, as in a flat run: ``ServerShard.retire``), or dropped and
counted by the protocol: none is in an aggregator. Nothing is sent again on resume, so nothing
is applied twice.

**Learners retire through the tree.** Hardsync's round waits for every learner that has not
said goodbye (``Rounds.retire``). A flat shard hears each learner's goodbye; in a tree it hears
only the top aggregators', at their very end. A learner stopped a step before another would
leave the other's next round waiting at the shard for a gradient that never comes, while the
aggregator waits for that other learner's goodbye, which waits for the round: a cycle. So when
a learner says goodbye to its aggregator, the aggregator sends its parents ``Tag.RETIRE`` with
the learner's index (after relaying the round the goodbye completed), every aggregator above
relays it, and the shard retires the learner from its rounds as it does at a flat goodbye. The
learner said goodbye only after the answers to its last pulls, i.e. after every round holding
its gradient closed, so the retirement never closes a round without a gradient on its way.

**Nothing waits forever.** An aggregator keeps a long poll out at its parent for each block; at
a cut the parent is not done and would hold it until an update that may never come. The
aggregator therefore says goodbye *first* and then collects exactly one answer per long poll:
either the parent answered before it read the goodbye (weights, received and dropped: the
parent's state holds them), or it answers at the goodbye with ``Reply.STOP`` to every pull the
departed child left held (``PullAnswers.release_departed`` at a shard, :func:`child_left` at an
aggregator). Every child of an aggregator leaves (a learner reaches its step boundary: it waits
only for answers that a closing round gives, see above; an aggregator by induction from the
leaves), so every loop ends, every rank reaches the checkpoint's agreement
(``pserver.ckpt.drivers.end``). Every wait goes through the ``Waiter`` (back-off, stall report).

**Resume.** The aggregator starts with no weights cached (timestamp −1) and holds its
children's pulls until its long poll brings the shard's checkpointed model, so no child gets the
initial w0 in its place. With λ = 1 the resumed run equals the uninterrupted one bit for bit
(one gradient per relayed sum: the sum is the gradient itself; tests/test_mpi_ckpt_tree.py).
"""

from __future__ import annotations

from typing import Any

from pserver.ckpt.files import State
from pserver.comm.wire import Header, Reply, Tag, WireError, reply_kind, retire_aux, retired_learner
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


def parents(agg: Any) -> list[int]:
    return sorted({r.parent for r in agg.relays.values()})


def send_retire(agg: Any, learner: int) -> None:
    """Tell every parent that ``learner`` computes no more (hardsync's rounds stop waiting)."""
    hdr = Header(Tag.RETIRE, -1, -1, agg.ctx.rank, retire_aux(learner)).pack(agg.out[0])
    for parent in parents(agg):
        agg.ch.ctrl.Send(hdr, parent, Tag.RETIRE)


def on_retire(agg: Any, h: Header) -> None:
    """A child aggregator's learner retired: relay it upwards."""
    send_retire(agg, retired_learner(h.aux))


def child_left(agg: Any, child: int) -> None:
    """After a child's goodbye (its last round relayed): STOP to the pulls it left held (a
    child aggregator's long polls), and its retirement upwards if it is a learner."""
    for r in agg.relays.values():
        for held in (r.waiting, r.starved):
            mine = [p for p in held if p.sender == child]
            if mine:
                held[:] = [p for p in held if p.sender != child]
                for _ in mine:
                    agg.reply(child, r, Reply.STOP)
    lay = agg.ctx.layout
    if lay.role(child) is Role.LEARNER:
        send_retire(agg, lay.index(child))


def leave(agg: Any) -> None:
    """Say goodbye to every parent, then collect the one answer each long poll still gets
    (weights sent before the parent read the goodbye, or its STOP): never ask again."""
    bye = Header(Tag.BYE, -1, -1, agg.ctx.rank).pack(agg.out[0])
    for parent in parents(agg):
        agg.ch.ctrl.Send(bye, parent, Tag.BYE)
    for r in agg.relays.values():
        if r.asked is not None:
            agg.waiter.wait(r.asked, f"the parent's last reply for block {r.block.index}")
            r.asked = None
            h = Header.unpack(agg.replies[r.block.index])
            agg.ctx.peers.note(h.sender, h)
            kind = reply_kind(h.aux)
            if kind == Reply.WEIGHTS:  # the parent's state holds them: received, not served
                agg.waiter.wait(r.posted, f"weights of block {r.block.index} from the parent")
                r.posted = None
                agg.bytes_in += r.w.nbytes
            elif kind != Reply.STOP:
                raise WireError(f"unexpected reply {h} to a long poll")
            r.stopped = True
        if r.posted is not None:
            r.posted.Cancel()
            r.posted.Wait()
            r.posted = None


def state(agg: Any) -> State:
    """An aggregator's checkpoint: its byte counts (the cut leaves it nothing else to keep)
    and its children (the tree's layout, checked by ``pserver.ckpt.resume.check_state``)."""
    attrs = {
        "role": "aggregator",
        "children": sorted(agg.children),  # checked on resume
        "bytes_in": agg.bytes_in,
        "bytes_out": agg.bytes_out,
    }
    return State({}, attrs)


def restore(agg: Any, saved: State) -> None:
    """Resume with nothing cached: children wait for the parent's (checkpointed) model."""
    agg.bytes_in = int(saved.attrs.get("bytes_in", 0))
    agg.bytes_out = int(saved.attrs.get("bytes_out", 0))
    for r in agg.relays.values():
        r.ts = NOT_CACHED

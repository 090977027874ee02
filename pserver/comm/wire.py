"""The wire contract: every message kind named once, and the fixed header that precedes payloads.

A header is five int64 words ``[kind, block, timestamp, sender, aux]`` sent as a buffer. Array
payloads (weights, gradients, minibatches) follow as separate buffer messages on their own
communicator, tagged by block, so a payload can never be mistaken for a header.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from pserver.errors import PserverError

# a pull's answer is the pull rule's decision (pure); it travels in a REPLY's aux word
from pserver.protocols.pull import Reply as Reply

HEADER_WORDS = 5


@enum.unique
class Tag(enum.IntEnum):
    """Message kinds; also the MPI tag that headers travel with on the control communicator."""

    PULL = 1  # learner -> server: block, timestamp it holds, aux = pull_aux(oldest it accepts)
    PUSH = 2  # learner -> server: block, timestamp of the weights used; payload follows
    # (aux = push_aux(iteration): 0, or the learner's iteration tag as a negative number;
    # from an aggregator: aux = sum_aux(n summed gradients), whose clocks follow as a CLOCK)
    REPLY = 3  # server -> learner: aux = reply_aux(Reply, version); block, weights' timestamp
    BYE = 4  # learner -> server / data server / stats server: this learner is finished
    DATA_REQ = 5  # learner I/O thread -> data server: send me a minibatch
    DATA_X = 6  # data server -> learner: minibatch features (payload)
    DATA_Y = 7  # data server -> learner: minibatch labels (payload)
    MODEL = 8  # server -> stats server: block weights for an epoch's test, aux = model_aux(epoch)
    RECORDS = 9  # anyone -> stats server: a small dict of statistics rows (pickled control data)
    SERVER_BYE = 10  # server -> stats server: the shard is finished
    CLOCK = 11  # aggregator -> parent, right after a PUSH with aux = n: n (learner, timestamp)
    # aggregator -> parent: learner ``aux`` (its index) said goodbye below us: a round no longer
    # waits for it (hardsync's Rounds.retire at a cut, pserver.ckpt.records.aggregator)
    RETIRE = 12
    # learner -> server: a PUSH with aux 0 (block rule) and the PULL of the same block that
    # would follow it at once, in one header: aux = pull_aux(oldest it accepts); the gradient
    # payload follows as after a PUSH. Half the headers of a push/pull (docs/performance.md)
    PUSH_PULL = 13


# -- ADPSGD's gossip (pserver.roles.gossip), on the learners' communicator ---------------------
# That communicator carries no other point-to-point traffic, so these tags cannot meet a Tag.


@enum.unique
class GossipTag(enum.IntEnum):
    """MPI tags of ADPSGD's exchanges (IBM paper §3, Fig. 3b) on the learners' communicator."""

    CTRL = 41  # sender -> receiver: a gossip header (an EXCHANGE or a BYE)
    REPLY = 42  # receiver -> sender: a gossip header (an ANSWER)
    MODEL = 43  # either way: the model that follows an EXCHANGE or an ANSWER


@enum.unique
class GossipKind(enum.IntEnum):
    """First word of a gossip header ``[kind, step, clock…]`` (int64)."""

    EXCHANGE = 1  # sender -> receiver: my weights follow; answer with yours
    ANSWER = 2  # receiver -> sender: my weights (before averaging) follow
    BYE = 3  # sender -> receiver: I start no more exchanges


# -- the aux word, one encoder and one decoder per message kind --------------------------------
# Outside this module nobody reads or compares ``Header.aux`` raw: it means a different thing for
# every kind (tests/test_wire.py checks the code base for raw uses).


def pull_aux(oldest: int) -> int:
    """The aux word of a PULL: the oldest timestamp the puller accepts (a long poll asks ts + 1)."""
    return int(oldest)


def pull_oldest(aux: int) -> int:
    """The oldest timestamp a PULL accepts; see pull_aux."""
    return aux


def push_aux(iteration: int | None) -> int:
    """The aux word of a learner's push: 0 (block rule), or ``-(iteration + 1)`` (< 0).

    Negative, so that it can never be read as an aggregator's count of summed gradients (> 0).
    """
    return 0 if iteration is None else -(iteration + 1)


def push_iteration(aux: int) -> int | None:
    """The iteration tag of a learner's push (None under the block rule); see push_aux."""
    return None if aux >= 0 else -aux - 1


def sum_aux(n: int) -> int:
    """The aux word of an aggregator's push: the number ``n >= 1`` of gradients it summed, whose
    (learner, timestamp) pairs follow as a CLOCK message."""
    if n < 1:
        raise ValueError(f"an aggregator's push sums at least one gradient, not {n}")
    return n


def push_summed(aux: int) -> int:
    """How many gradients a PUSH carries summed by an aggregator (followed by a CLOCK message of
    that many pairs); 0 for a learner's own push (push_aux: 0 or negative)."""
    return max(aux, 0)


def split_push_pull(h: Header) -> tuple[Header, Header]:
    """The PUSH and the PULL a ``Tag.PUSH_PULL`` header stands for, in that order."""
    push = Header(Tag.PUSH, h.block, h.timestamp, h.sender, push_aux(None))
    pull = Header(Tag.PULL, h.block, h.timestamp, h.sender, pull_aux(pull_oldest(h.aux)))
    return push, pull


VERSION_SHIFT = 8  # a reply's aux: the Reply kind in the low byte, a window version above it


def reply_aux(kind: Reply, version: int = 0) -> int:
    """The aux word of a reply: its kind, and which shared-window version holds the weights."""
    return int(kind) | (version << VERSION_SHIFT)


def split_reply(aux: int) -> tuple[int, int]:
    """(kind, window version) of a reply's aux word."""
    return aux & ((1 << VERSION_SHIFT) - 1), aux >> VERSION_SHIFT


def reply_kind(aux: int) -> int:
    """The Reply kind of a reply's aux word (whatever window version it names); see reply_aux."""
    return split_reply(aux)[0]


def model_aux(epoch: int) -> int:
    """The aux word of a MODEL message: the epoch whose end the snapshot is for."""
    return int(epoch)


def model_epoch(aux: int) -> int:
    """The epoch of a MODEL message; see model_aux."""
    return aux


def bye_aux(consumed: int) -> int:
    """The aux word of a learner's BYE to the data server: the minibatches it computed on
    (the checkpoint's cut: those served after them are replayed on resume)."""
    return int(consumed)


def bye_consumed(aux: int) -> int:
    """The minibatches a learner computed on; see bye_aux."""
    return aux


def retire_aux(learner: int) -> int:
    """The aux word of a RETIRE: the index of the learner that said goodbye."""
    return int(learner)


def retired_learner(aux: int) -> int:
    """The learner a RETIRE names; see retire_aux."""
    return aux


class WireError(PserverError):
    """A message that breaks the contract (unknown kind, wrong size)."""


@dataclass(frozen=True)
class Header:
    kind: Tag
    block: int = -1
    timestamp: int = -1
    sender: int = -1
    aux: int = 0

    def pack(self, buf: np.ndarray) -> np.ndarray:
        buf[:] = (int(self.kind), self.block, self.timestamp, self.sender, self.aux)
        return buf

    @classmethod
    def unpack(cls, buf: np.ndarray) -> Header:
        try:
            kind = Tag(int(buf[0]))
        except ValueError:
            raise WireError(
                f"unknown message kind {int(buf[0])} in header {buf.tolist()}"
            ) from None
        return cls(kind, int(buf[1]), int(buf[2]), int(buf[3]), int(buf[4]))

    def __str__(self) -> str:
        aux: object = self.aux
        if self.kind is Tag.REPLY:
            kind, version = split_reply(self.aux)
            name = Reply(kind).name if kind in Reply._value2member_map_ else str(kind)
            aux = f"{name}@v{version}" if version else name
        return f"{self.kind.name}(block={self.block}, ts={self.timestamp}, aux={aux})"


REPLY_TAG_BASE = 1000  # MPI tag of a reply = base + block: replies to one learner overtake
# each other (a held pull answers late), so each block's reply must match its own receive


def reply_tag(block: int) -> int:
    return REPLY_TAG_BASE + block


def header_buffer(n: int = 1) -> np.ndarray:
    """Preallocated room for ``n`` headers (one row each)."""
    return np.zeros((n, HEADER_WORDS), dtype=np.int64)

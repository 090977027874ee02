"""The pull-answer rule, once for every rank that serves weights (shard, aggregator, relaying
learner): Rudra's timestamp inquiry (Gupta et al. §III-B) with long polls.

A pull carries the timestamp the puller holds and the oldest timestamp it accepts (``Tag.PULL``).
The answer, in this order of precedence:

1. ``Reply.STOP`` once training is over for the block;
2. ``None`` (hold the pull) while the block is older than the puller accepts (hardsync and PSP
   wait for the next update; a long poll waits for newer weights) or while the protocol holds
   the puller back (SSP's staleness bound, ``Protocol.pull_ready``);
3. ``Reply.CURRENT`` when the puller already holds this timestamp, with no payload, unless it
   computes on the served version in place (shared-window zero copy: it must pin the version);
4. ``Reply.WEIGHTS`` otherwise: the served version follows. Whether a version is free to pin
   (``VersionPool.may_pin``) is the caller's matter: such a pull waits alone for a release.

Pure: no MPI, no arrays.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


@enum.unique
class Reply(enum.IntEnum):
    """A pull's answer (sent in a REPLY header's aux word, ``pserver.comm.wire.reply_aux``)."""

    WEIGHTS = 1  # newer weights follow as a payload
    CURRENT = 2  # the learner's copy is current: no payload (Rudra's timestamp inquiry)
    STOP = 3  # training is over for this block
    # a relaying learner of the broadcast tree stopped at a cut (a signal, a periodic pause):
    # no newer weights will come from it in this part (pserver.roles.bcast, *Checkpoints*)
    LEFT = 4


def pull_answer(
    *,
    stopped: bool,
    ts: int,
    holds: int,
    accepts: int,
    ready: Callable[[], bool] | None = None,
    reads: bool = False,
) -> Reply | None:
    """The answer to one pull, or None to hold it (see the module's rule).

    ``ts``: timestamp of the served weights; ``holds``: the puller's timestamp; ``accepts``:
    the oldest timestamp it accepts; ``ready``: whether the protocol lets it go on (asked only
    when the rest would serve it); ``reads``: it computes on the served version in place.
    """
    if stopped:
        return Reply.STOP
    if ts < accepts or (ready is not None and not ready()):
        return None
    if ts == holds and not reads:
        return Reply.CURRENT
    return Reply.WEIGHTS

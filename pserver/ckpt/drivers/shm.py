"""Checkpoints over the shared-memory transport (``comm.transport = "shm"``, ``pserver.comm.shm``).

With shm a shard keeps its weights and their versions in the node's window, and the learners
of the node read them there (a copy acknowledged on ``ack``, or, one shard holding the model in
one block, computing on the version in place) and leave their gradients in their slots. What
lives only in the window, and what a checkpoint does with it:

* **the shard's weights** ``w`` of a block: the current version (``ShardBlock.w`` is a view of
  it; with ``protocol.predict`` and under BMUF/MA ``w`` is private and the versions hold the
  served model). Saved as with messages, but *copied* out of the window (:func:`host_copy`):
  ``Backend.to_host`` returns a numpy array itself, and a periodic checkpoint's next part
  (``pserver.ckpt.drivers.periodic``) is built in the same window, whose version 0 it first fills
  with w0, so a state aliasing version 0 restored w0 at every pause;
* **the other versions** (older weights still read, PP-ASGD's f_S(w, M), BMUF's W_g(t)): not
  saved. Every learner collected the answers to its last pulls before its goodbye (a window
  copy acknowledged, a loan taken), so none reads them after the cut; the served model is
  computed again from the saved state (the predictor's, BMUF's W and Δ) at the first pull;
* **the version counters** (``pserver.protocols.versions.VersionPool``: which version is current,
  pins, tickets): not saved. They belong to the shard's driver and restart as in a fresh run
  (one version allocated, version 0 current, nothing pinned); the restored weights are written
  into version 0 (``restore_block`` copies into ``w``, which the builder placed there), so the
  first answer after the cut names version 0 and holds the checkpointed weights. No pin crosses
  the cut: the shard's ``finish`` waits for every acknowledgement of a window copy
  (``ServedVersions.drain``), and a learner's goodbye releases its loan (``on_bye``:
  ``unpin_reader``) — it computes nothing more in this part, and its next part (or the resumed
  run) pulls before it computes;
* **a learner's view** (the version it computes on in place, or its copy): not saved. A
  blocking learner's state is its step count; on resume every block's timestamp is -1, so its
  first pull is answered with weights (never ``CURRENT``), after the shard's ``Win.Sync``;
* **the gradient slots**: dead at the cut. A push's header follows its gradient's ``Win.Sync``
  and precedes the learner's goodbye on ``ctrl`` (non-overtaking), so the shard took every
  gradient in a slot before its loop ended, and the slots are written again before being read.

Nothing in a checkpoint names a version, a slot or a node, so the resumed run may place its
ranks on other nodes (its window plan is made again, ``pserver.comm.shm.plan``); changing
``comm.transport`` or ``comm.versions`` itself is refused with the other config keys
(``checkpoint.check_compatible``: one line, exit 2).

Why the cut is consistent: shm changes where payloads lie, not the order of the control
messages the cut of ``pserver.ckpt.drivers.end`` rests on (every push before its learner's
goodbye, every goodbye before the shard's save), so the saved weights hold exactly the
gradients the dump says were taken. With λ = 1 the resumed run computes the same arithmetic
on the same bits: bit-identical to the uninterrupted run (tests/test_mpi_ckpt_shm.py).

Why nothing waits forever at the cut: the only waits shm adds are a shard's for the
acknowledgements of its window copies (each sent by the learner as soon as it copied the
version out, which it does for every reply it collects before its goodbye) and an update's
bounded ``give_sends``. A pull held for lack of a free version (``starved``) is released when a
pin goes; a learner that stopped early (a signal seen one step before the others, a periodic
pause) would otherwise keep its last loan pinned for the rest of the part, and with
``comm.versions`` below one per local learner plus one its pin could starve the others' pulls
for good (hardsync with ``comm.versions = 2``: every pull refused, the round never closes).
Its goodbye therefore releases it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pserver.comm.shm import SharedWindows


def host_copy(
    to_host: Callable[[Any], np.ndarray], window: SharedWindows | None
) -> Callable[[Any], np.ndarray]:
    """``to_host`` for a shard's checkpoint: a numpy array that owns its memory when ``window``
    (the node's ``SharedWindows``, or None) may hold the array, else ``to_host`` itself."""
    if window is None:
        return to_host
    return lambda a: np.array(to_host(a), copy=True)

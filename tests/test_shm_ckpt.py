"""The shm transport's checkpoint, in one process (pserver/ckpt/drivers/shm.py; the mpiexec
tests are tests/test_mpi_ckpt_shm.py)."""

from __future__ import annotations

import numpy as np

from pserver.ckpt.drivers.shm import host_copy
from pserver.ckpt.records.shard import block_state
from pserver.plan.config import Config
from pserver.protocols.shard_block import ShardBlock
from pserver.protocols.versions import VersionPool


def test_a_shard_state_owns_its_weights_when_they_lie_in_the_window():
    """The weights are a view of window version 0, which a periodic checkpoint's next part
    fills with w0 before restoring the saved state: the state must not see that write."""
    window = np.arange(12, dtype=np.float32)  # stands for the node's window
    b = ShardBlock.build(window[:6], Config(), 1, 100, np)
    arrays, _ = block_state(b, 0, host_copy(np.asarray, window))
    window[:6] = -1.0  # the next part's builder writes w0 there
    assert arrays["w0"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    aliased, _ = block_state(b, 0, host_copy(np.asarray, None))  # messages: no copy needed
    assert np.shares_memory(aliased["w0"], window)


def test_a_loan_kept_past_a_goodbye_starves_every_pull_with_two_versions():
    """Why a learner's goodbye releases its loan (``ServerShard.on_bye``): with
    ``comm.versions = 2`` the update after it copies the weights to the other version, and
    the loan on the old one then leaves no free version for any pull."""
    pool = VersionPool(2)
    gone = pool.pin()  # the stopped learner's last loan of the current version
    pool.write()  # the others' round: copy-on-write into version 1
    assert pool.current == 1 and not pool.may_pin()  # every pull would wait for a free one
    pool.release(gone)  # on_bye
    assert pool.may_pin()

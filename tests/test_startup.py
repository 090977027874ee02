"""The start-up agreement's decisions (pure; the MPI part is in test_mpi_startup.py)."""

from __future__ import annotations

import numpy as np

from pserver.errors import ConfigError
from pserver.runtime.startup import BAD_INPUT, FAILED, OK, failure_message, outcome, status_of


def test_status_tells_bad_input_from_any_other_failure():
    assert status_of(None) == OK
    assert status_of(ConfigError("x")) == BAD_INPUT
    assert status_of(MemoryError()) == FAILED
    assert status_of(KeyboardInterrupt()) == FAILED


def test_first_failing_rank_speaks_and_every_rank_exits_alike():
    everyone_bad = np.array([BAD_INPUT] * 4, dtype=np.int32)
    assert [outcome(everyone_bad, r) for r in range(4)] == [(2, True, "")] + [(2, False, "")] * 3
    one_bad = np.array([OK, OK, BAD_INPUT, OK], dtype=np.int32)
    assert outcome(one_bad, 2) == (2, True, " (on rank 2 of 4)")
    assert outcome(one_bad, 0) == (2, False, " (on rank 2 of 4)")
    crashed = np.array([OK, FAILED, BAD_INPUT, OK], dtype=np.int32)
    assert outcome(crashed, 1) == (1, True, "")  # its message names the rank already
    assert outcome(np.zeros(4, dtype=np.int32), 0) == (0, False, "")


def test_unexpected_failure_names_rank_host_exception_and_place():
    try:
        raise OSError(5, "Input/output error")
    except OSError as e:
        line = failure_message(e, 3, 7)
    assert line.startswith("rank 3 of 7 on ")
    assert "OSError: [Errno 5] Input/output error (raised at test_startup.py:" in line
    assert failure_message(ConfigError("optim.lr = -1"), 0, 4) == "optim.lr = -1"
    assert failure_message(MemoryError(), 0, 1).endswith("the run: MemoryError")  # not raised

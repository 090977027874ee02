"""Typed checkpoint records (issue 21 item 1): a record written through ``pserver.ckpt.files``
and read back through its one reader is the same record, and keeps the file's attributes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pserver.ckpt.drivers.lockstep import LockstepRecord
from pserver.ckpt.files import State, read_state, write_state
from pserver.ckpt.records.aggregator import AggregatorRecord


def round_trip(state: State, path: Path) -> State:
    write_state(path, state.arrays, state.attrs)
    return read_state(path)


def test_the_aggregator_record_round_trips(tmp_path: Path) -> None:
    record = AggregatorRecord((3, 5), bytes_in=1200, bytes_out=640)
    state = record.to_state()
    assert state.attrs == {"role": "aggregator", "children": [3, 5], "bytes_in": 1200,
                           "bytes_out": 640}  # fmt: skip
    assert AggregatorRecord.from_state(round_trip(state, tmp_path / "a.h5")) == record
    assert AggregatorRecord.from_state(State({}, {})) == AggregatorRecord((), 0, 0)  # an old file


def test_the_lockstep_record_round_trips(tmp_path: Path) -> None:
    w, v = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    record = LockstepRecord(w, {"velocity": v}, version=7, next_epoch=2)
    state = record.to_state()
    assert sorted(state.arrays) == ["opt.velocity", "w"]
    assert state.attrs == {"version": 7, "next_epoch": 2}
    back = LockstepRecord.from_state(round_trip(state, tmp_path / "l.h5"), ["velocity"])
    assert (back.version, back.next_epoch) == (7, 2)
    np.testing.assert_array_equal(back.w, w)
    np.testing.assert_array_equal(back.opt["velocity"], v)

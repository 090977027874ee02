"""Typed checkpoint records (issue 21 item 1): a record written through ``pserver.ckpt.files``
and read back through its one reader is the same record, and keeps the file's attributes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pserver.ckpt.drivers.lockstep import LockstepRecord
from pserver.ckpt.files import CheckpointError, State, read_state, write_state
from pserver.ckpt.records.aggregator import AggregatorRecord
from pserver.ckpt.records.gossip import GossipRecord
from pserver.ckpt.records.partial_pull import CopiesRecord, RoundsRecord
from pserver.ckpt.records.prediction import PredictorRecord
from pserver.ckpt.records.quota import QuotaRecord
from pserver.ckpt.records.shard import BlockRecord, block_state
from pserver.protocols.shard_block import ShardBlock


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


# -- the five records that were dictionaries built by functions (issue 21, second pass) -------
# Each test writes the record's state and the state the function of before wrote (its layout
# spelled out here: array names, dtypes, attributes) and compares the two files byte for byte:
# a checkpoint of before resumes, one written now reads back the same.


def same_file(a: State, b: State, tmp_path: Path) -> None:
    write_state(tmp_path / "a.h5", a.arrays, a.attrs)
    write_state(tmp_path / "b.h5", b.arrays, b.attrs)
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()


def test_the_quota_record_round_trips_in_the_layout_of_before(tmp_path: Path) -> None:
    record = QuotaRecord("free", {1: 13, 0: 9})
    state = record.to_state()
    same_file(state, State({}, {"kind": "free", "computed": {"0": 9, "1": 13}}), tmp_path)
    assert QuotaRecord.from_state(round_trip(state, tmp_path / "q.h5")) == record
    # a list of counts is a quota too (its index is the position), as check_quota accepts
    listed = QuotaRecord.from_state(State({}, {"kind": "free", "computed": [9, 13]}))
    assert listed == record


def test_the_copies_record_round_trips_in_the_layout_of_before(tmp_path: Path) -> None:
    w = np.arange(6, dtype=np.float32)
    record = CopiesRecord(w, {1: 3, 0: 5}, tag=7, steps=12)
    state = record.to_state()
    before = State({"w": w}, {"steps": 12, "tag": 7, "have": [[0, 5], [1, 3]]})
    same_file(state, before, tmp_path)
    back = CopiesRecord.from_state(round_trip(state, tmp_path / "c.h5"))
    assert (back.have, back.tag, back.steps) == ({0: 5, 1: 3}, 7, 12)
    np.testing.assert_array_equal(back.w, w)


def test_the_rounds_record_round_trips_and_an_old_block_without_it_reads_empty() -> None:
    record = RoundsRecord({2: 4, 0: 6})
    assert record.to_state().attrs == {"latest": [[0, 6], [2, 4]]}
    assert RoundsRecord.from_state(record.to_state()) == record
    assert RoundsRecord.from_state(State({}, {})) == RoundsRecord({})


def test_the_gossip_record_round_trips_in_the_layout_of_before(tmp_path: Path) -> None:
    w, v = np.arange(5, dtype=np.float32), np.full(5, 0.25, np.float32)
    record = GossipRecord(w, {"velocity": v}, clock=(4, 3), k=5, exchanged=4, next_epoch=2)
    state = record.to_state()
    attrs = {"clock": [4, 3], "k": 5, "exchanged": 4, "next_epoch": 2}
    same_file(state, State({"w": w, "opt.velocity": v}, attrs), tmp_path)
    back = GossipRecord.from_state(round_trip(state, tmp_path / "g.h5"), ["velocity"])
    assert (back.clock, back.k, back.exchanged, back.next_epoch) == ((4, 3), 5, 4, 2)
    np.testing.assert_array_equal(back.opt["velocity"], v)


def predicted_block() -> ShardBlock:
    """A PP-ASGD block after 7 updates: a probe in flight, a running mean, a rate."""
    from test_prediction_ckpt import block, steps

    b = block()
    steps(b, 7, seed=1)
    return b


def test_the_block_and_predictor_records_round_trip_in_the_layout_of_before(
    tmp_path: Path,
) -> None:
    b = predicted_block()
    p = b.predictor
    arrays, attrs = block_state(b, 2, np.array)
    record = BlockRecord.from_state(State(arrays, attrs), 2, ["velocity"], True, True)
    again_state = record.to_state()
    assert list(again_state.arrays) == list(arrays) and again_state.attrs == attrs
    # the layout of before: the arrays in this order, the attributes with these names
    velocity = b.updater.state_arrays()["velocity"]
    before = State(
        {"w2": b.w, "opt2.velocity": velocity, "pred2.w0": p.probe.w0, "pred2.m0": p.probe.m0},
        {
            "ts": b.ts, "applied": b.applied, "dropped": b.dropped,
            "next_epoch": b.epochs.next_epoch, "open_round": b.in_round,
            "predictor": {
                "recent": [float(x) for x in p.mean.recent], "window": p.mean.recent.maxlen,
                "lr": float(p.lr), "steps": int(p.steps),
                "probe": [p.probe.origin, p.probe.steps, p.probe.due],
            },
        },
    )  # fmt: skip
    assert list(arrays) == list(before.arrays)
    same_file(State(arrays, attrs), before, tmp_path)
    back = round_trip(State(arrays, {"blocks": {"2": attrs}}), tmp_path / "s.h5")
    again = BlockRecord.from_state(State(back.arrays, back.attrs["blocks"]["2"]), 2,
                                   ["velocity"], True, True)  # fmt: skip
    assert again.predictor is not None and again.predictor.probe == record.predictor.probe
    assert (again.ts, again.applied, again.next_epoch) == (b.ts, b.applied, b.epochs.next_epoch)


@pytest.mark.parametrize(
    "read, said",
    [
        (lambda: QuotaRecord.from_state(State({}, {"kind": "free"}), "q"),
         "q: the checkpoint lacks the attribute 'computed'"),
        (lambda: QuotaRecord.from_state(State({}, {"kind": "free", "computed": {"a": 1}}), "q"),
         "q: the quota names learner 'a', not an index"),
        (lambda: CopiesRecord.from_state(State({}, {"tag": 1, "steps": 1, "have": []}), "c"),
         "c: the checkpoint lacks the learner's copies 'w'"),
        (lambda: CopiesRecord.from_state(State({"w": np.zeros(2)}, {"steps": 1, "have": []}), "c"),
         "c: the checkpoint lacks the attribute 'tag'"),
        (lambda: RoundsRecord.from_state(State({}, {"latest": [[0, "x"]]}), "r"),
         r"r: the checkpoint's 'latest\[0\]\[1\]' is 'x'"),
        (lambda: GossipRecord.from_state(State({"w": np.zeros(2)}, {"clock": [1], "k": 1,
                                                "exchanged": 1}), [], "g"),
         "g: the checkpoint lacks the attribute 'next_epoch'"),
        (lambda: GossipRecord.from_state(State({"w": np.zeros(2)}, {}), ["velocity"], "g"),
         "g: the checkpoint lacks 'exchange.opt.velocity'"),
        (lambda: GossipRecord.from_state(State({"w": np.zeros(2)}, {"clock": [1, -2], "k": 0,
                                                "exchanged": 0, "next_epoch": 0}), [], "g"),
         r"g: the checkpoint's 'clock\[1\]' is -2"),
        (lambda: BlockRecord.from_state(State({"w0": np.zeros(2)}, {}), 0, ["velocity"],
                                        where="s"),
         "s block 0: the checkpoint lacks 'opt0.velocity'"),
        (lambda: BlockRecord.from_state(State({"w0": np.zeros(2)}, {"ts": 1, "applied": 1,
                                        "dropped": 0, "next_epoch": "2"}), 0, [], where="s"),
         "s block 0: the checkpoint's 'next_epoch' is '2', expected int"),
        (lambda: BlockRecord.from_state(State({"w0": np.zeros(2)}, {"ts": 1, "applied": 1,
                                        "dropped": 0, "next_epoch": 2}), 0, [], True, where="s"),
         "s block 0: the checkpoint lacks the attribute 'predictor'"),
        (lambda: PredictorRecord.from_state(State({}, {"recent": [], "window": 4, "lr": 0.1,
                                            "steps": 2, "probe": [-1, 0, -1]}), 3, True, "p"),
         "p: the checkpoint lacks the probe's 'pred3.w0'"),
    ],
)  # fmt: skip
def test_a_malformed_record_is_refused_with_a_line_naming_the_field(read, said) -> None:  # noqa: ANN001
    with pytest.raises(CheckpointError, match=f"^{said}"):
        read()


def test_the_resume_check_reads_a_shard_block_through_its_record(tmp_path: Path) -> None:
    """A shard's block record is read by ``check_state`` before training, as its restore will
    read it: a malformed round accounting is one line there, not a crash after start-up."""
    from types import SimpleNamespace

    from pserver.ckpt.files import Manifest
    from pserver.ckpt.resume import Resume, check_state
    from pserver.plan.config import Config
    from pserver.plan.topology import Block, Role

    cfg = Config()
    cfg.protocol.name, cfg.optim.rule, cfg.data.batch_size = "hardsync", "momentum", 4
    b = ShardBlock.build(np.linspace(-1, 1, 10).astype(np.float32), cfg, 2, 16, np)
    assert getattr(b.protocol, "rounds", None) is not None  # hardsync keeps its rounds
    arrays, attrs = block_state(b, 0, np.array)
    block = Block(index=0, start=0, stop=10, shard=0)
    plan = SimpleNamespace(
        cfg=cfg, rank=0, role=Role.SERVER, model=SimpleNamespace(dtype=np.float32),
        layout=SimpleNamespace(index=lambda rank: 0), blocks_of=lambda shard: [block],
    )  # fmt: skip

    def resume(block_attrs: dict) -> Resume:
        state = State(arrays, {"role": "server", "shard": 0, "blocks": {"0": block_attrs}})
        return Resume(tmp_path, Manifest(0, 1, 0.0, {}, {}), state)

    check_state(plan, resume(attrs))  # type: ignore[arg-type]  # the record as written passes
    bad = {**attrs, "rounds": {"latest": [[0, "x"]]}}
    with pytest.raises(CheckpointError, match=r"block 0: the checkpoint's 'latest\[0\]\[1\]'"):
        check_state(plan, resume(bad))  # type: ignore[arg-type]

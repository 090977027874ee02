"""The records' JSON attributes are untrusted input (issue 22, D4): partial pulling's learner
copies, the overlapped learner's pipeline, PP-ASGD's predictor and the learners-only quota are
refused before training, one line each, when a type or a range is wrong — where their
``restore`` would otherwise crash after start-up with a traceback (one process, no MPI)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_pipeline_ckpt import N, exchange, prefixed, push
from test_prediction_ckpt import SIZE, block

from pserver.ckpt.files import CheckpointError, State
from pserver.ckpt.records.partial_pull import check_learner, learner_state
from pserver.ckpt.records.pipeline import check_pipeline, pipeline_state
from pserver.ckpt.records.prediction import check_predictor
from pserver.ckpt.records.quota import check_quota
from pserver.ckpt.records.shard import block_state
from pserver.plan.config import Config
from pserver.plan.topology import Block
from pserver.protocols.inflight import InflightWindow


def edited(state: State, edit) -> State:  # noqa: ANN001
    attrs = copy.deepcopy(state.attrs)
    edit(attrs)
    return State(dict(state.arrays), attrs)


def copies() -> State:
    w = np.arange(6, dtype=np.float32)
    return State({"exchange.w": w}, {"exchange": learner_state(w, {0: 5, 1: 3}, 7, 12).attrs})


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda a: a["exchange"].update(tag="7"), "'tag' is '7'"),
        (lambda a: a["exchange"].update(tag=-1), "'tag' is -1"),
        (lambda a: a["exchange"].update(steps=1.5), "'steps' is 1.5"),
        (lambda a: a["exchange"].update(have=[[0, 5], [1]]), r"have\[1\] is \[1\], not a pair"),
        (lambda a: a["exchange"].update(have=[[0, "x"], [1, 3]]), r"'have\[0\]\[1\]' is 'x'"),
    ],
)
def test_partial_pulling_copies_with_a_bad_attribute_are_refused(edit, said):
    check_learner(copies(), 6, np.float32, [0, 1], "here")  # the unedited state passes
    with pytest.raises(CheckpointError, match=said):
        check_learner(edited(copies(), edit), 6, np.float32, [0, 1], "here")


def pipeline() -> State:
    ex = exchange(InflightWindow(2, [0, 1]))
    push(ex, 1.0)
    return prefixed(pipeline_state(ex))


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda a: a["exchange"].update(steps=-2), "'steps' is -2"),
        (lambda a: a["exchange"].update(current="01"), "'current' is '01'"),
        (lambda a: a["exchange"].update(drops=[{"push": "x", "ts": {}}]), "'push' is 'x'"),
        (lambda a: a["exchange"].update(drops=[7]), r"'drops\[0\]' is 7"),
        (lambda a: a["exchange"]["window"].update(pushed=None), "'pushed' is None"),
        (lambda a: a["exchange"]["window"].update(acked={"0": -4}), r"'acked\[0\]' is -4"),
    ],
)
def test_a_pipeline_with_a_bad_attribute_is_refused(edit, said):
    check_pipeline(pipeline(), N, np.float32, [0, 1], "here")
    with pytest.raises(CheckpointError, match=said):
        check_pipeline(edited(pipeline(), edit), N, np.float32, [0, 1], "here")


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda p: p.update(window=0), "'window' is 0"),
        (lambda p: p.update(recent=["a"]), r"'recent\[0\]' is 'a'"),
        (lambda p: p.update(window=1, recent=[1.0, 2.0]), "2 recent values for a window of 1"),
        (lambda p: p.update(lr="0.1"), "'lr' is '0.1'"),
        (lambda p: p.update(probe=[1, 2]), "expected \\[origin, steps, due\\]"),
        (lambda p: p.update(probe=[1, 2, -5]), r"'probe\[2\]' is -5"),
    ],
)
def test_a_predictor_with_a_bad_attribute_is_refused(edit, said):
    cfg = Config()
    cfg.protocol.predict, cfg.protocol.predict_probe = True, 0
    b = Block(index=1, start=0, stop=SIZE, shard=0)
    arrays, attrs = block_state(block(), 1, np.array)
    check_predictor(cfg, State(arrays, {"blocks": {"1": attrs}}), b, "here")
    bad = copy.deepcopy(attrs)
    edit(bad["predictor"])
    with pytest.raises(CheckpointError, match=said):
        check_predictor(cfg, State(arrays, {"blocks": {"1": bad}}), b, "here")


@pytest.mark.parametrize(
    "quota, said",
    [
        ({"kind": 3, "computed": {}}, "'kind' is 3"),
        ({"kind": "lockstep", "computed": {"0": -3}}, r"'computed\[0\]' is -3"),
        ({"kind": "lockstep", "computed": {"x": 3}}, "names learner 'x'"),
        ({"kind": "lockstep", "computed": [1, 2]}, None),  # a list of counts: index = position
        ("lockstep", "'quota' is 'lockstep'"),
    ],
)
def test_a_quota_with_a_bad_attribute_is_refused(quota, said):
    check_quota({"quota": {"kind": "lockstep", "computed": {"0": 4, "1": 3}}}, "here")
    if said is None:
        check_quota({"quota": quota}, "here")
        return
    with pytest.raises(CheckpointError, match=said):
        check_quota({"quota": quota}, "here")

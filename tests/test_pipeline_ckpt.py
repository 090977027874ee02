"""The overlapped learner's pipeline in a checkpoint, in one process
(pserver.ckpt.records.pipeline):
which pushes the shards dropped at their stop, the round trip through a State, the checks."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from pserver.ckpt.files import CheckpointError, State
from pserver.ckpt.records.pipeline import (
    check_pipeline,
    dropped_pushes,
    pipeline_state,
    restore_pipeline,
)
from pserver.protocols.inflight import InflightWindow

N = 6


def exchange(window: InflightWindow | None = None) -> SimpleNamespace:
    """The attributes of an OverlapExchange that the pipeline reads and writes."""
    backend = SimpleNamespace(to_host=np.asarray, copy_from_host=lambda h, out: np.copyto(out, h))
    return SimpleNamespace(
        side=SimpleNamespace(backend=backend),
        link=SimpleNamespace(w=np.zeros(N, np.float32), w_comm=np.zeros(N, np.float32)),
        grads=[np.zeros(N, np.float32), np.zeros(N, np.float32)],
        have={0: 0, 1: 0}, arrived={}, current=set(), stopped=set(),
        window=window, recent=deque(maxlen=2), steps=0, replay=None,
    )  # fmt: skip


def push(ex: SimpleNamespace, value: float) -> None:
    """What OverlapExchange.start_push and gradient record of one push to every live block."""
    live = [b for b in ex.have if b not in ex.stopped]
    ex.recent.append((ex.steps, {b: ex.have[b] for b in live}))
    ex.grads[ex.steps % 2][:] = value
    ex.window.push()
    ex.steps += 1


def test_the_push_after_the_request_answered_stop_is_the_dropped_one():
    """λ = 1 async at a run's end: push M-1, request (covered M), push M, STOP: push M only."""
    ex = exchange(InflightWindow(2, [0, 1]))
    push(ex, 1.0)
    for b in (0, 1):
        ex.window.ask(b)  # covered = 1
    ex.have = {0: 7, 1: 7}
    push(ex, 2.0)  # sent after the request: it reaches the shard after its stop
    for b in (0, 1):
        ex.window.stop(b)
        ex.stopped.add(b)
    assert dropped_pushes(ex) == [(1, {0: 7, 1: 7})]
    # a block still live (a signal's cut) dropped nothing
    ex.window.stopped.discard(1)
    assert dropped_pushes(ex) == [(1, {0: 7})]
    # hardsync and PSP (no window): their long polls are held, a STOP drops nothing
    ex.window = None
    assert dropped_pushes(ex) == []


def test_the_pipeline_goes_through_a_state_unchanged():
    ex = exchange(InflightWindow(2, [0, 1]))
    push(ex, 1.0)
    for b in (0, 1):
        ex.window.ask(b)
        ex.window.answer(b)
    ex.link.w[:] = 3.0
    ex.link.w_comm[:] = 4.0
    ex.arrived = {0: 5, 1: 5}
    ex.have = {0: 4, 1: 4}
    push(ex, 2.0)
    state = pipeline_state(ex)
    back = exchange(InflightWindow(2, [0, 1]))
    restore_pipeline(back, State(dict(state.arrays), dict(state.attrs)))
    assert np.array_equal(back.link.w, ex.link.w) and back.link.w is not ex.link.w
    assert np.array_equal(back.link.w_comm, ex.link.w_comm)
    assert back.arrived == ex.arrived and back.have == ex.have
    for name in ("pushed", "covered", "acked", "answered"):
        assert getattr(back.window, name) == getattr(ex.window, name), name
    assert back.replay == ([], [])  # nothing stopped, nothing dropped
    check_pipeline(prefixed(state), N, np.float32, [0, 1], "here")


def prefixed(state: State) -> State:
    """The state as the trainer stores it (``exchange.`` arrays, ``exchange`` attributes)."""
    return State({f"exchange.{k}": v for k, v in state.arrays.items()},
                 {"exchange": state.attrs})  # fmt: skip


def test_check_refuses_other_shapes_and_blocks():
    ex = exchange(InflightWindow(2, [0, 1]))
    state = prefixed(pipeline_state(ex))
    with pytest.raises(CheckpointError, match=r"'exchange.w' is float32\[6\]"):
        check_pipeline(state, N + 1, np.float32, [0, 1], "here")
    with pytest.raises(CheckpointError, match="blocks.count changed"):
        check_pipeline(state, N, np.float32, [0, 1, 2], "here")
    del state.arrays["exchange.w"]
    with pytest.raises(CheckpointError, match="lacks 'exchange.w'"):
        check_pipeline(state, N, np.float32, [0, 1], "here")
    check_pipeline(State({}, {"exchange": {"steps": 3}}), N, np.float32, [0], "here")  # older


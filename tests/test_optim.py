"""Update rules against hand-computed steps (the arithmetic is written out in each test)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from pserver.errors import ConfigError
from pserver.optim.rules import RULES, make_updater, scheduled_lr
from pserver.plan.config import OptimConfig

DTYPES = [np.float32, np.float64]


def run(rule: str, w0: list[float], grads: list[list[float]], lr: float, dtype, **cfg) -> list:
    """Apply ``grads`` one step at a time from ``w0``; return w after each step."""
    updater = make_updater(OptimConfig(rule=rule, **cfg), len(w0), np, dtype)
    w = np.array(w0, dtype=dtype)
    history = []
    for g in grads:
        updater.step(w, np.array(g, dtype=dtype), lr)
        history.append(w.copy())
    return history


def check(history: list, expected: list[list[float]], dtype) -> None:
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    assert len(history) == len(expected)
    for got, want in zip(history, expected, strict=True):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sgd(dtype) -> None:
    # w = [1, 2], lr = 0.1:
    #   g = [0.5, -1] -> w = [1 - 0.05, 2 + 0.1] = [0.95, 2.1]
    #   g = [1, 1]    -> w = [0.95 - 0.1, 2.1 - 0.1] = [0.85, 2.0]
    history = run("sgd", [1.0, 2.0], [[0.5, -1.0], [1.0, 1.0]], 0.1, dtype)
    check(history, [[0.95, 2.1], [0.85, 2.0]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_momentum(dtype) -> None:
    # m = 0.9, lr = 0.1, v starts at 0.
    # first element, g = 1, 1, 1 from w = 1:
    #   v = 1     w = 1 - 0.1         = 0.9
    #   v = 1.9   w = 0.9 - 0.19      = 0.71
    #   v = 2.71  w = 0.71 - 0.271    = 0.439
    # second element, g = -2, 0, 2 from w = 2:
    #   v = -2     w = 2 + 0.2        = 2.2
    #   v = -1.8   w = 2.2 + 0.18     = 2.38
    #   v = 0.38   w = 2.38 - 0.038   = 2.342
    grads = [[1.0, -2.0], [1.0, 0.0], [1.0, 2.0]]
    history = run("momentum", [1.0, 2.0], grads, 0.1, dtype, momentum=0.9)
    check(history, [[0.9, 2.2], [0.71, 2.38], [0.439, 2.342]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nesterov(dtype) -> None:
    # m = 0.9, lr = 0.1; w -= lr * (g + m * v) with v already updated.
    # first element, g = 1, 1, 1 from w = 1:
    #   v = 1     step 0.1 * (1 + 0.9)   = 0.19     w = 0.81
    #   v = 1.9   step 0.1 * (1 + 1.71)  = 0.271    w = 0.539
    #   v = 2.71  step 0.1 * (1 + 2.439) = 0.3439   w = 0.1951
    # second element, g = 0, 0, 0 from w = -1: nothing moves.
    grads = [[1.0, 0.0]] * 3
    history = run("nesterov", [1.0, -1.0], grads, 0.1, dtype, momentum=0.9)
    check(history, [[0.81, -1.0], [0.539, -1.0], [0.1951, -1.0]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adagrad(dtype) -> None:
    # lr = 0.5, eps = 0, w = [1, 1]:
    #   g = [3, 4]: h = [9, 16]   w -= 0.5 * [3/3, 4/4] = [0.5, 0.5]  -> [0.5, 0.5]
    #   g = [4, 3]: h = [25, 25]  w -= 0.5 * [4/5, 3/5] = [0.4, 0.3]  -> [0.1, 0.2]
    history = run("adagrad", [1.0, 1.0], [[3.0, 4.0], [4.0, 3.0]], 0.5, dtype, eps=0.0)
    check(history, [[0.5, 0.5], [0.1, 0.2]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adagrad_eps_in_denominator(dtype) -> None:
    # lr = 0.5, eps = 1, w = 1, g = 3: h = 9, w -= 0.5 * 3 / (3 + 1) = 0.375 -> 0.625
    check(run("adagrad", [1.0], [[3.0]], 0.5, dtype, eps=1.0), [[0.625]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_decay_sgd(dtype) -> None:
    # wd = 0.1, lr = 0.5, w = 2:
    #   g = 1: d = 1 + 0.2 = 1.2     w = 2 - 0.6 = 1.4
    #   g = 0: d = 0 + 0.14 = 0.14   w = 1.4 - 0.07 = 1.33
    history = run("sgd", [2.0], [[1.0], [0.0]], 0.5, dtype, weight_decay=0.1)
    check(history, [[1.4], [1.33]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_decay_momentum(dtype) -> None:
    # wd = 0.5, m = 0.5, lr = 1, w = 1, g = 0 throughout:
    #   d = 0.5    v = 0.5                  w = 1 - 0.5 = 0.5
    #   d = 0.25   v = 0.25 + 0.25 = 0.5    w = 0.5 - 0.5 = 0
    history = run("momentum", [1.0], [[0.0], [0.0]], 1.0, dtype, momentum=0.5, weight_decay=0.5)
    check(history, [[0.5], [0.0]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_decay_nesterov(dtype) -> None:
    # wd = 1, m = 0.5, lr = 0.5, w = 2, g = 0: d = 2, v = 2, step 0.5 * (2 + 1) = 1.5 -> 0.5
    history = run("nesterov", [2.0], [[0.0]], 0.5, dtype, momentum=0.5, weight_decay=1.0)
    check(history, [[0.5]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_decay_adagrad(dtype) -> None:
    # wd = 1, lr = 1, eps = 0, w = 2, g = 1: d = 3, h = 9, w -= 3 / 3 -> 1
    history = run("adagrad", [2.0], [[1.0]], 1.0, dtype, eps=0.0, weight_decay=1.0)
    check(history, [[1.0]], dtype)


def test_learning_rate_is_per_step() -> None:
    # Protocols scale lr per update. w = 1, g = 1 with lr 0.1 -> 0.9, then lr 0.2 -> 0.7.
    updater = make_updater(OptimConfig(rule="sgd", lr=5.0), 1, np, np.float64)
    w = np.ones(1)
    updater.step(w, np.ones(1), 0.1)
    updater.step(w, np.ones(1), 0.2)
    np.testing.assert_allclose(w, [0.7])


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_step_is_in_place_and_allocates_nothing(rule: str, dtype) -> None:
    n = 1 << 15
    updater = make_updater(OptimConfig(rule=rule, weight_decay=0.01), n, np, dtype)
    w = np.ones(n, dtype=dtype)
    g = np.full(n, 0.5, dtype=dtype)
    state = updater.state_arrays()
    addresses = {k: v.ctypes.data for k, v in state.items()}
    w_address = w.ctypes.data
    updater.step(w, g, 0.1)  # warm-up: any lazy one-off set-up happens here
    tracemalloc.start()
    try:
        for _ in range(3):
            g.fill(0.5)
            updater.step(w, g, 0.1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A block-sized temporary would show up as n * itemsize bytes (at least 128 KiB here).
    assert peak < 4096
    assert w.ctypes.data == w_address and w.dtype == dtype
    assert np.all(w < 1)  # the update landed in the caller's array
    after = updater.state_arrays()
    assert after.keys() == state.keys()
    for k, v in after.items():
        assert v is state[k] and v.ctypes.data == addresses[k] and v.dtype == dtype


def test_state_arrays_by_rule() -> None:
    def keys(rule: str) -> set[str]:
        return set(make_updater(OptimConfig(rule=rule), 4, np, np.float32).state_arrays())

    assert keys("sgd") == set()
    assert keys("momentum") == keys("nesterov") == {"velocity"}
    assert keys("adagrad") == {"sum_sq"}


def test_state_restore_by_copying_into_live_buffers() -> None:
    # momentum 0.9, lr 1, w = 0, g = 1 with a restored velocity of 1: v = 1.9, w = -1.9
    updater = make_updater(OptimConfig(rule="momentum", momentum=0.9), 1, np, np.float64)
    np.copyto(updater.state_arrays()["velocity"], [1.0])
    w = np.zeros(1)
    updater.step(w, np.ones(1), 1.0)
    np.testing.assert_allclose(w, [-1.9])


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="optim.rule = 'adam'"):
        make_updater(OptimConfig(rule="adam"), 4, np, np.float32)
    with pytest.raises(ConfigError, match="floating-point"):
        make_updater(OptimConfig(), 4, np, np.int32)
    with pytest.raises(ConfigError, match="at least one element"):
        make_updater(OptimConfig(), 0, np, np.float32)
    updater = make_updater(OptimConfig(), 4, np, np.float32)
    with pytest.raises(ValueError, match="4 elements"):
        updater.step(np.zeros(3, np.float32), np.zeros(3, np.float32), 0.1)


def test_step_decay_multiplies_by_gamma_at_each_milestone() -> None:
    cfg = OptimConfig(lr=0.1, lr_milestones=[2, 5], lr_gamma=0.5)
    got = [scheduled_lr(cfg, e) for e in range(7)]
    assert got == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025])
    assert scheduled_lr(OptimConfig(lr=0.3), 100) == 0.3  # no milestones: constant


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_from_is_copy_then_step_bit_for_bit(rule: str, wd: float, dtype) -> None:
    """The fused copy-and-step (a new version's update) equals ``copyto`` then ``step`` exactly,
    over several pieces with a ragged end, and leaves its source alone."""
    from pserver.optim.rules import FUSED_PIECE

    n = 2 * FUSED_PIECE + 37
    rng = np.random.default_rng(3)
    src, g = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    cfg = OptimConfig(rule=rule, lr=0.1, weight_decay=wd)
    fused, plain = make_updater(cfg, n, np, dtype), make_updater(cfg, n, np, dtype)
    kept = src.copy()
    for lr in (0.1, 0.05):  # twice: the rule's state advances the same way too
        w_fused, w_plain = np.full(n, np.nan, dtype), src.copy()
        fused.step_from(w_fused, src, g.copy(), lr)
        plain.step(w_plain, g.copy(), lr)
        assert np.array_equal(w_fused, w_plain)
    assert np.array_equal(src, kept)
    assert fused.fuses_copy == (rule == "sgd")

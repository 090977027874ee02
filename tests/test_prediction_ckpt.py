"""PP-ASGD's predictor in a shard block's checkpoint, in one process
(``pserver.ckpt.records.prediction``
through ``pserver.ckpt.records.shard``): saved mid-run with a probe in flight and restored into a
fresh
block, the next updates serve, probe and log exactly as the block that never stopped."""

from __future__ import annotations

import numpy as np
import pytest

from pserver.ckpt.files import CheckpointError, State, read_state, write_state
from pserver.ckpt.records.prediction import check_predictor, probe_arrays
from pserver.ckpt.records.shard import block_state, expected_arrays, restore_block
from pserver.plan.config import Config
from pserver.plan.topology import Block
from pserver.protocols.shard_block import ShardBlock

SIZE = 10


def block(epochs: int = 100) -> ShardBlock:
    cfg = Config()
    cfg.protocol.name, cfg.protocol.predict, cfg.protocol.predict_probe = "async", True, 3
    cfg.optim.rule, cfg.run.epochs, cfg.data.batch_size = "momentum", epochs, 4
    return ShardBlock.build(np.linspace(-1, 1, SIZE).astype(np.float32), cfg, 4, 16, np)


def steps(b: ShardBlock, n: int, seed: int) -> list[tuple]:
    """``n`` updates by gradients 0-3 updates stale; what each served and probed."""
    rng = np.random.default_rng(seed)
    seen = []
    for _ in range(n):
        buf = b.inbox()
        buf[:] = rng.normal(size=SIZE).astype(np.float32)
        b.accept([(0, max(0, b.ts - int(rng.integers(4))), None)], buf, 0.0)
        applied = b.apply(b.commit())
        b.epoch_ends()
        probe = applied.probe
        seen.append(
            (
                applied.steps,
                b.predictor.mean.value,
                b.serve().tobytes(),
                None if probe is None else (probe.origin, probe.horizon, probe.error),
            )
        )
    return seen


def test_a_predicted_block_restored_mid_probe_continues_as_the_uninterrupted_one(tmp_path):
    cut, whole = block(), block()
    head = steps(cut, 7, seed=1)  # a probe every 3 updates: the one started at 6 is in flight
    assert cut.predictor.probe.origin == 6 and cut.predictor.mean.value > 0
    arrays, attrs = block_state(cut, 2, np.array)
    assert set(arrays) == set(expected_arrays(cut, 2)) == {"w2", "opt2.velocity", *probe_arrays(2)}
    write_state(tmp_path / "r.h5", arrays, {"blocks": {"2": attrs}})  # through the file
    saved = read_state(tmp_path / "r.h5")
    resumed = block()
    copy_in = lambda host, out: np.copyto(out, host)  # noqa: E731
    restore_block(resumed, 2, saved.arrays, saved.attrs["blocks"]["2"], copy_in)
    assert resumed.serve().tobytes() == cut.serve().tobytes()  # the first pull after resume
    assert steps(whole, 7, seed=1) == head
    tail = steps(resumed, 20, seed=2)
    assert steps(whole, 20, seed=2) == tail
    assert np.array_equal(resumed.w, whole.w)
    assert any(p is not None and p[0] == 6 for *_, p in tail)  # the cut probe ended


def test_a_fresh_predictor_serves_other_weights():
    """What the saved predictor prevents: a fresh one (rate 0) serves w, not f_S(w, M)."""
    cut = block()
    steps(cut, 7, seed=1)
    fresh = block()
    arrays, attrs = block_state(cut, 0, np.array)
    del attrs["predictor"]
    fresh.w[:] = arrays["w0"]
    fresh.velocity[:] = arrays["opt0.velocity"]
    assert fresh.serve().tobytes() != cut.serve().tobytes()


def test_a_checkpoint_without_the_predictor_is_refused():
    cfg = Config()
    cfg.protocol.predict, cfg.protocol.predict_probe = True, 3
    b = Block(index=1, start=0, stop=SIZE, shard=0)
    good = block()
    arrays, attrs = block_state(good, 1, np.array)
    check_predictor(cfg, State(arrays, {"blocks": {"1": attrs}}), b, "here")
    with pytest.raises(CheckpointError, match="lacks block 1's prediction state"):
        check_predictor(cfg, State(arrays, {"blocks": {"1": {}}}), b, "here")
    short = dict(arrays, **{"pred1.w0": np.zeros(3)})
    with pytest.raises(CheckpointError, match=r"'pred1.w0' is float64\[3\]"):
        check_predictor(cfg, State(short, {"blocks": {"1": attrs}}), b, "here")

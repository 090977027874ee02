"""pserver-sim with several shards and blocks against real runs where a real run is
deterministic (issue 23): hardsync with 2 shards × 2 blocks, with one and with four learners —
each shard's rounds (timestamps, n_gradients, ⟨σ⟩, the learning rate) and their vector clocks,
every block's end-of-run counts and the learners' minibatches are identical; with one learner
also every shard's gradient rows; and PP-ASGD over async with one learner on 2 shards × 2 blocks:
every shard's updates and its ``predictions`` rows (its first block's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mpirun import QUICKSTART, train

from pserver.dump.reader import Dump, load_dump
from pserver.plan.config import load_config
from pserver.sim.engine import simulate

pytestmark = pytest.mark.mpi

SHARDS = ["protocol.name=hardsync", "cluster.servers=2", "blocks.count=2"]


def real_and_simulated(tmp_path: Path, n: int, *extra: str) -> tuple[Dump, Dump]:
    common = [f"cluster.learners={n}", "run.epochs=1", *SHARDS, *extra]
    train(tmp_path / "real", n + 4, *common, timeout=300)  # 2 shards, stats, data, λ learners
    cfg = load_config(str(QUICKSTART), [f"run.out_dir={tmp_path / 'sim'}", *common])
    simulate(cfg)
    return load_dump(tmp_path / "real" / "stats.h5"), load_dump(tmp_path / "sim" / "stats.h5")


def per_shard(dump: Dump, group: str, column: str, shard: int) -> np.ndarray:
    """``group/column`` of one shard's rows, in the order it wrote them (the statistics server
    interleaves the shards' rows by arrival, a simulation by simulated time)."""
    g = dump.group(group)
    return g[column][g["shard"] == shard]


def same_per_shard(real: Dump, sim: Dump, group: str, columns: tuple[str, ...]) -> None:
    assert sorted(np.unique(real.group(group)["shard"])) == [0, 1]
    for shard in (0, 1):
        for col in columns:
            a, b = per_shard(real, group, col, shard), per_shard(sim, group, col, shard)
            if a.dtype.kind == "f":
                np.testing.assert_allclose(a, b, rtol=1e-12, err_msg=f"{group}/{col} {shard}")
            else:
                assert np.array_equal(a, b), (group, col, shard, a[:10], b[:10])


def by_block(dump: Dump) -> dict[str, np.ndarray]:
    b = dump.group("blocks")
    order = np.argsort(b["block"])
    return {c: v[order] for c, v in b.items()}


def same_blocks_and_learners(real: Dump, sim: Dump) -> None:
    a, b = by_block(real), by_block(sim)
    for col in ("block", "shard", "timestamp", "applied", "dropped", "size"):
        assert np.array_equal(a[col], b[col]), (col, a[col], b[col])
    rounds = lambda d: sorted(zip(d.group("learners")["learner"],  # noqa: E731
                                  d.group("learners")["minibatches"], strict=True))
    assert rounds(real) == rounds(sim)


def test_one_learner_two_shards_two_blocks_agree_exactly(tmp_path):
    real, sim = real_and_simulated(tmp_path, 1)
    assert real.rows("updates") > 100  # an epoch of the digits: 85 minibatches, 2 shards
    same_per_shard(real, sim, "updates", ("timestamp", "n_gradients", "mean_staleness", "lr",
                                          "vector_clock"))
    same_per_shard(real, sim, "gradients", ("learner", "timestamp", "staleness", "update"))
    same_blocks_and_learners(real, sim)


def test_hardsync_rounds_and_clocks_of_two_shards_agree_at_four_learners(tmp_path):
    real, sim = real_and_simulated(tmp_path, 4)
    same_per_shard(real, sim, "updates", ("timestamp", "n_gradients", "mean_staleness", "lr",
                                          "vector_clock"))
    same_blocks_and_learners(real, sim)
    for dump in (real, sim):  # each round of each shard took one gradient of every learner
        g = dump.group("gradients")
        for shard in (0, 1):
            mine = (g["shard"] == shard) & (g["update"] != -1)
            for u in np.unique(g["update"][mine]):
                assert sorted(g["learner"][mine & (g["update"] == u)]) == [0, 1, 2, 3]
            assert np.all(g["staleness"][mine] == 0)


def test_pp_asgd_with_one_learner_on_two_shards_agrees_exactly(tmp_path):
    real, sim = real_and_simulated(tmp_path, 1, "protocol.name=async", "protocol.predict=true")
    assert real.rows("predictions") > 100
    same_per_shard(real, sim, "updates", ("timestamp", "n_gradients", "mean_staleness", "lr",
                                          "vector_clock"))
    same_per_shard(real, sim, "predictions", ("timestamp", "steps", "staleness_mean"))
    same_blocks_and_learners(real, sim)

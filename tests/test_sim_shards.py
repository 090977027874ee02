"""pserver-sim with several shards and blocks (pserver/sim/servers.py, shard.py, learner.py):
the blocks are the real run's (``split_blocks``), each shard writes its own consistent rows,
PSP's partial pulling computes on kept copies of the late blocks and waits ``tau2`` for them,
and a simulated dump with several shards and partial pulling passes ``pserver-stats check``.
One process, no MPI (the exact agreement with real runs: tests/test_sim_shards_mpi.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pserver.dump.check import check_dump
from pserver.dump.reader import Dump, load_dump
from pserver.optim.prediction import WINDOW
from pserver.plan.config import load_config
from pserver.plan.topology import split_blocks
from pserver.sim.engine import model_bytes, simulate

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "examples" / "quickstart.toml")
TIMEOUT = 120

PSP = ["protocol.name=psp", "protocol.c=6", "protocol.tau1=0.001", "protocol.pull_fraction=0.5",
       "protocol.tau2=0.0005", "cluster.servers=2", "blocks.count=4",
       "inject.pull_delay_prob=0.02", "inject.pull_delay=0.05"]  # fmt: skip


def sim(tmp_path: Path, *overrides: str, name: str = "run") -> Dump:
    cfg = load_config(QUICK, [f"run.out_dir={tmp_path / name}", "run.epochs=2",
                              "cluster.learners=8", "sim.compute_cv=0.5", *overrides])
    return load_dump(simulate(cfg).dump)


def test_psp_with_partial_pulling_and_delays_on_two_shards_passes_the_check(tmp_path):
    d = sim(tmp_path, *PSP)
    assert check_dump(d) == []
    up = d.group("updates")
    assert sorted(np.unique(up["shard"])) == [0, 1]
    delays = d.group("delays")
    assert sorted(np.unique(delays["shard"])) == [0, 1]  # drawn per shard, learner, request
    assert set(np.unique(delays["block"])) <= {0, 1, 2, 3}
    t = d.group("train")
    assert np.any(t["stale_fraction"] > 0)  # some steps computed on a kept copy of a block
    out = subprocess.run([sys.executable, "-m", "pserver.stats.cli", "check",
                          str(tmp_path / "run" / "stats.h5")], capture_output=True, text=True,
                         timeout=TIMEOUT, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0 and "consistent" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("strategy", ["async", "softsync", "hardsync", "ssp", "bmuf"])
def test_every_shard_strategy_on_two_shards_and_five_blocks_is_consistent(tmp_path, strategy):
    d = sim(tmp_path, f"protocol.name={strategy}", "cluster.servers=2", "blocks.count=5")
    assert check_dump(d) == []
    assert sorted(np.unique(d.group("updates")["shard"])) == [0, 1]
    assert sorted(d.group("blocks")["block"]) == [0, 1, 2, 3, 4]


def test_the_blocks_are_the_real_runs_and_each_push_carries_its_blocks_bytes(tmp_path):
    overrides = ["protocol.name=hardsync", "cluster.servers=2", "blocks.count=3"]
    d = sim(tmp_path, *overrides)
    cfg = load_config(QUICK, ["cluster.learners=8", *overrides])
    nbytes, _ = model_bytes(cfg)
    itemsize = np.dtype(cfg.model.dtype).itemsize
    n_params = nbytes // itemsize
    real = split_blocks(n_params, [n_params], "size", 3, 2)
    b = d.group("blocks")
    order = np.argsort(b["block"])
    assert [(int(b["shard"][i]), int(b["size"][i])) for i in order] == \
        [(x.shard, x.size) for x in real]  # fmt: skip
    steps = int(d.group("learners")["minibatches"].sum())
    servers = d.group("servers")
    for s, got in zip(servers["shard"], servers["bytes_in"], strict=True):
        assert got == steps * itemsize * sum(x.size for x in real if x.shard == s)
    assert check_dump(d) == []


def test_hardsync_on_two_shards_takes_every_learner_each_round_of_each(tmp_path):
    d = sim(tmp_path, "protocol.name=hardsync", "cluster.servers=2", "blocks.count=2")
    up = d.group("updates")
    for s in (0, 1):
        mine = up["shard"] == s
        assert np.all(up["n_gradients"][mine] == 8)
        ts = up["timestamp"][mine]
        assert np.array_equal(ts, np.arange(1, len(ts) + 1))
        assert np.array_equal(up["vector_clock"][mine], np.repeat(ts[:, None] - 1, 8, 1))
    assert check_dump(d) == []


SLOW_SHARD = ["protocol.name=psp", "protocol.c=8", "cluster.servers=2", "blocks.count=2",
              "inject.slow_server=1", "inject.server_factor=30", "sim.update_per_byte=1e-8"]


def test_partial_pulling_computes_on_a_kept_copy_of_the_slow_shards_block(tmp_path):
    full = sim(tmp_path, *SLOW_SHARD, name="full")
    half = sim(tmp_path, *SLOW_SHARD, "protocol.pull_fraction=0.5", name="half")
    assert np.all(full.group("train")["stale_fraction"] == 0)  # b = 1: every block, every step
    stale = half.group("train")["stale_fraction"]
    assert np.all(np.isin(stale, (0.0, 0.5))) and np.mean(stale == 0.5) > 0.5
    assert check_dump(half) == []
    # the same samples in less simulated time: the slow shard's replies are not waited for
    assert half.attrs["wall_time"] < full.attrs["wall_time"]


def test_tau2_is_waited_for_after_the_bth_block(tmp_path):
    tau2 = 0.002
    d = sim(tmp_path, *SLOW_SHARD, "protocol.pull_fraction=0.5", f"protocol.tau2={tau2}")
    t = d.group("train")
    stale = t["stale_fraction"] > 0
    assert stale.any()
    assert np.all(t["pull_time"][stale] >= tau2 - 1e-12)  # it waited τ2 before leaving one out
    never = sim(tmp_path, *SLOW_SHARD, "protocol.pull_fraction=0.5", "protocol.tau2=100",
                name="never")
    assert np.all(never.group("train")["stale_fraction"] == 0)  # every block came within τ2


def test_both_event_loops_give_the_same_dump_with_several_shards(tmp_path):
    a = sim(tmp_path, *PSP, "sim.loop=heap", name="heap")
    b = sim(tmp_path, *PSP, "sim.loop=simpy", name="simpy")
    for group in ("updates", "gradients", "train", "learners", "delays", "blocks"):
        for col, values in a.group(group).items():
            assert np.array_equal(values, b.group(group)[col], equal_nan=True), (group, col)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["cluster.servers=2", "blocks.count=1"], "cannot feed cluster.servers = 2"),
        (["cluster.servers=2", "blocks.count=2", "inject.slow_server=2"],
         "inject.slow_server = 2"),
        # sim-more's engines are simulated over one shard with one block (engine.check_one_block)
        (["cluster.servers=2", "blocks.count=2", "cluster.tree_fanout=2"],
         "cluster.tree_fanout = 2: pserver-sim simulates it with one shard and one block only"),
        (["blocks.count=3", "protocol.name=async", "comm.mode=thread"],
         "comm.mode = 'thread': pserver-sim simulates it with one shard and one block only"),
        (["cluster.servers=2", "blocks.count=2", "protocol.name=hardsync",
          "comm.mode=nonblocking", "cluster.bcast_fanout=2"],
         "cluster.bcast_fanout = 2, comm.mode = 'nonblocking': pserver-sim simulates it"),
    ],
)
def test_bad_shards_are_one_line_exit_2_and_nothing_written(tmp_path, overrides, says):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "pserver.sim.cli", QUICK, f"run.out_dir={out}",
         "cluster.learners=4", *overrides],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("pserver-sim: error: ")
    assert says in r.stderr and not out.exists()


@pytest.mark.parametrize("overrides", [
    ["protocol.name=async"],
    ["protocol.name=softsync", "protocol.n=2"],
    PSP,
], ids=["async", "softsync", "psp-partial"])  # fmt: skip
def test_pp_asgd_on_two_shards_predicts_every_block_and_writes_the_first_blocks_rows(
    tmp_path, overrides
):
    """As ``ShardRows.prediction``: one ``predictions`` row per update of each shard's first
    block, its S̄ the running mean of that shard's ``updates`` rows' ⟨σ⟩."""
    d = sim(tmp_path, "cluster.servers=2", "blocks.count=5", *overrides, "protocol.predict=true")
    assert check_dump(d) == []
    up, pr = d.group("updates"), d.group("predictions")
    assert sorted(np.unique(pr["shard"])) == [0, 1]
    for shard in (0, 1):
        mine_up, mine_pr = up["shard"] == shard, pr["shard"] == shard
        assert np.array_equal(pr["timestamp"][mine_pr], up["timestamp"][mine_up])
        sigma = up["mean_staleness"][mine_up]
        want = np.array([sigma[max(0, i + 1 - WINDOW):i + 1].mean() for i in range(len(sigma))])
        np.testing.assert_allclose(pr["staleness_mean"][mine_pr], want, rtol=1e-12)
        assert np.array_equal(pr["steps"][mine_pr], [max(0, math.floor(m)) for m in want])

"""Sizes that cannot fit the node are refused before anything is allocated, naming the key."""

from __future__ import annotations

import logging

import pytest

from pserver.errors import ConfigError
from pserver.plan.config import load_config
from pserver.plan.limits import (
    NodeBudget,
    RunSizes,
    available_memory,
    cgroup_left,
    check_blas_threads,
    data_bytes,
)

GiB = 2**30


def test_available_memory_reads_meminfo_and_a_lower_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    assert available_memory(meminfo, tmp_path / "none") == 4000000 * 1024
    group = tmp_path / "cg" / "job"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(f"{GiB}\n")
    (group / "memory.current").write_text(f"{GiB // 4}\n")
    me = tmp_path / "self_cgroup"
    me.write_text("0::/job\n")
    assert cgroup_left(tmp_path / "cg", me) == GiB - GiB // 4
    (group / "memory.max").write_text("max\n")
    assert cgroup_left(tmp_path / "cg", me) is None


def test_data_on_every_rank_of_the_node_is_counted():
    budget = NodeBudget(10 * GiB, ["server", "stats", "data", "learner"], rank=3)
    budget.check_data(2 * GiB, "data.n_samples = 1")  # 4 ranks x 2 GiB fits in 10
    with pytest.raises(ConfigError, match=r"data.n_samples = 9: every rank holds the dataset, "
                       r"so the 4 ranks on the node of rank 3 would need about 12.0 GiB"):
        budget.check_data(3 * GiB, "data.n_samples = 9")
    NodeBudget(None, ["learner"], 0).check_data(10**18, "unknown memory: no check")


def test_run_check_names_the_largest_part_and_its_keys():
    sizes = RunSizes(n_params=GiB // 4, itemsize=4, activations=0, n_features=64, batch_size=32,
                     prefetch=2, on_gpu=False, versions=1)
    keys = {"model": "model.hidden = [1, 2]", "prefetch": "data.prefetch = 2"}
    budget = NodeBudget(8 * GiB, ["server", "stats", "data", "learner"], rank=0)
    with pytest.raises(ConfigError) as info:  # (5 + 2 + 0 + 4) GiB of model copies
        budget.check_run(0, sizes, keys)
    assert str(info.value).startswith("model.hidden = [1, 2]: the 4 ranks on the node of rank 0")
    assert "11.0 GiB for the model" in str(info.value)
    NodeBudget(12 * GiB, budget.roles, 0).check_run(0, sizes, keys)  # fits
    greedy = RunSizes(1, 4, 0, 64, 32, prefetch=10**9, on_gpu=False)
    with pytest.raises(ConfigError, match="data.prefetch = 2: .* for the prefetch"):
        budget.check_run(0, greedy, keys)


def test_data_bytes_counts_the_copies():
    assert data_bytes(1000, 10, 4) == 1000 * 10 * 12 + 16 * 1000


def test_blas_threads_bounded_by_the_cores():
    check_blas_threads(4, cores=4)
    with pytest.raises(ConfigError, match="run.blas_threads = 1000000: expected at most 4"):
        check_blas_threads(10**6, cores=4)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model.hidden=[1000000, 1000000]"], "model.hidden = [1000000, 1000000]"),
        (["model.kind=null", "model.size_mib=100000000"], "model.size_mib = 100000000.0"),
        (["data.prefetch=1000000000"], "data.prefetch = 1000000000"),
        (["data.source=synthetic", "data.n_samples=10000000000"], "data.n_samples = 10000000000"),
        (["data.source=synthetic", "data.n_features=10000000000"], "data.n_features = 10000000000"),
    ],
)
def test_prepare_refuses_what_the_node_cannot_hold(overrides, key):
    from pserver.runtime.context import prepare

    cfg = load_config(None, overrides)
    with pytest.raises(ConfigError) as info:  # before: MemoryError, or minutes of allocation
        prepare(cfg, 7, 3, logging.getLogger("test"), available=64 * GiB)
    assert key in str(info.value).split(":")[0], info.value  # named first, before the reason


def test_prepare_accepts_the_quickstart_on_a_small_node():
    from pserver.runtime.context import prepare

    plan, _ = prepare(load_config(None, []), 7, 3, logging.getLogger("test"), available=GiB)
    assert plan.model.n_params > 0


def test_the_shards_weight_versions_are_counted():
    """A shard serves pulls from up to comm.versions copies of its blocks
    (pserver.protocols.versions)."""
    one = RunSizes(GiB // 4, 4, 0, 64, 32, prefetch=2, on_gpu=False, versions=1)
    three = RunSizes(GiB // 4, 4, 0, 64, 32, prefetch=2, on_gpu=False, versions=3)
    assert three.rank_bytes("server")["model"] - one.rank_bytes("server")["model"] == 2 * GiB
    assert three.rank_bytes("aggregator")["model"] - one.rank_bytes("aggregator")["model"] == (
        2 * GiB)
    assert three.rank_bytes("learner") == one.rank_bytes("learner")


def test_only_the_data_and_statistics_servers_hold_the_dataset(tmp_path):
    """Memory where it is needed: a learner or shard sees the data's shape, not its samples."""
    from pserver.runtime.context import prepare

    over = ["data.source=synthetic", "data.n_samples=4000", f"run.out_dir={tmp_path}"]
    cfg = load_config(None, over)
    held = {}
    for rank in range(5):  # server, stats, data, 2 learners
        plan, _ = prepare(cfg, 5, rank, logging.getLogger("test"), available=None, rid="t")
        held[plan.layout.describe(rank)] = (plan.dataset.X_train.size, plan.dataset.X_test.size)
        assert plan.train_size == 3000
    assert held["data server"][0] > 0 and held["stats server"] == (0, 1000 * 64)
    assert held["server 0"] == held["learner 0"] == held["learner 1"] == (0, 0)


def test_the_node_check_counts_the_ranks_that_load_the_data():
    roles = ["server", "stats", "data", "learner", "learner", "learner"]
    budget = NodeBudget(10 * GiB, roles, rank=0, holders=["stats", "data"])
    budget.check_data(4 * GiB, "data file 'big.h5'")  # 2 x 4 GiB fit; 6 x 4 GiB would not
    with pytest.raises(ConfigError, match="the stats and data server.* 2 of them"):
        budget.check_data(6 * GiB, "data file 'big.h5'")

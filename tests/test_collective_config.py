"""Bad input of the learners-only strategies (issue 12 item 6), refused before training (pure)."""

from __future__ import annotations

import pytest

from pserver.errors import ConfigError
from pserver.plan.config import load_config

LEVELS = {"THREAD_SINGLE": 0, "THREAD_FUNNELED": 1, "THREAD_SERIALIZED": 2, "THREAD_MULTIPLE": 3}


@pytest.mark.parametrize("name", ["sync", "hybrid"])
def test_servers_default_to_zero_and_a_given_count_is_refused(name):
    mode: list[str] = []
    assert load_config(None, [f'protocol.name="{name}"', *mode]).cluster.servers == 0
    assert load_config(None, [f'protocol.name="{name}"', "cluster.servers=0", *mode])
    with pytest.raises(ConfigError, match="cluster.servers = 1: protocol.name = .* runs without"):
        load_config(None, [f'protocol.name="{name}"', "cluster.servers=1", *mode])


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("cluster.tree_fanout=2", "cluster.tree_fanout configures parameter-server shards"),
        ("cluster.bcast_fanout=2", "cluster.bcast_fanout configures"),
        ("comm.versions=3", "comm.versions configures"),
        ("comm.max_inflight=2", "comm.max_inflight configures"),
        ("blocks.count=4", "blocks.count configures"),
        ("inject.slow_server=0", "inject.slow_server configures"),
        ('comm.transport="shm"', 'comm.transport = .shm. shares shard windows'),
        ('protocol.lr_policy="mean"', 'protocol.lr_policy = .mean. does not apply to sync'),
        ("protocol.ref_batch=64", "protocol.ref_batch = 64 belongs to hardsync"),
        ("protocol.c=2", "protocol.c = 2 belongs to psp"),
    ],
)
def test_shard_keys_refused_for_sync(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(None, ['protocol.name="sync"', override])


def test_quickstart_switches_to_sync_by_protocol_name_alone():
    from mpirun import QUICKSTART

    cfg = load_config(QUICKSTART, ['protocol.name="sync"'])
    assert cfg.cluster.servers == 0 and cfg.protocol.lr_policy == "auto"


def test_hybrid_in_every_mode_needs_thread_multiple():
    from pserver.runtime.context import check_exchange_thread

    for mode in ("blocking", "nonblocking", "thread"):
        cfg = load_config(None, ['protocol.name="hybrid"', f'comm.mode="{mode}"'])
        check_exchange_thread(cfg, LEVELS["THREAD_MULTIPLE"], LEVELS)
        with pytest.raises(ConfigError, match="hybrid.* needs MPI_THREAD_MULTIPLE; this MPI "
                           "library provides MPI_THREAD_SERIALIZED .* protocol.name = .sync."):
            check_exchange_thread(cfg, LEVELS["THREAD_SERIALIZED"], LEVELS)
    sync = load_config(None, ['protocol.name="sync"'])
    check_exchange_thread(sync, LEVELS["THREAD_SINGLE"], LEVELS)  # no thread: nothing to check


def test_a_comparison_files_shard_keys_are_set_aside_for_sync():
    """examples/psp.toml (4 shards, 8 blocks, shard delays) run with protocol.name=sync: its shard
    keys take no effect and are listed at start (issue 25: one file serves a comparison)."""
    from mpirun import ROOT

    from pserver.plan.config import unread

    cfg = load_config(ROOT / "examples" / "psp.toml", ['protocol.name="sync"'])
    assert cfg.cluster.servers == 0 and cfg.blocks.count == 1 and cfg.cluster.learners == 4
    listed = unread(cfg)
    assert "cluster.servers = 4 (the strategies with shards)" in listed
    assert "blocks.count = 8 (the strategies with shards)" in listed
    assert cfg.set_aside["blocks.count"] == 8
    with pytest.raises(ConfigError, match="cluster.servers = 4: protocol.name = 'sync' runs"):
        load_config(ROOT / "examples" / "psp.toml", ['protocol.name="sync"', "cluster.servers=4"])

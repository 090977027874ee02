"""The strategy registry (pserver/strategies/): lookups, descriptors, their parameters and
checks, and that the config's choices and docs/config.md follow it. One process, no MPI."""

from __future__ import annotations

import typing
from dataclasses import replace
from pathlib import Path

import pytest

from pserver import strategies
from pserver.errors import ConfigError
from pserver.plan.config import CHOICES, ProtocolConfig, check_ranks, load_config, pull_timestamp
from pserver.protocols.psp import PartialPush
from pserver.protocols.rudra import Hardsync, Softsync
from pserver.protocols.ssp import StaleSynchronous
from pserver.strategies import PS, PS_OVERLAP, REGISTRY, Ranks, Strategy, lookup, make_protocol
from pserver.strategies.base import COLLECTIVE, FAMILIES, PARAMETER_SERVER

DOCS = Path(__file__).resolve().parents[1] / "docs"
NAMES = ("hardsync", "softsync", "async", "psp", "ssp")


def test_registry_holds_the_five_parameter_server_strategies():
    ps = tuple(n for n, s in REGISTRY.items() if s.family == PARAMETER_SERVER)
    assert ps == NAMES  # the model-averaging family follows them (tests/test_bmuf.py)
    assert CHOICES["protocol.name"] == strategies.names()
    for name, s in ((n, REGISTRY[n]) for n in NAMES):
        assert lookup(name) is s and s.name == name
        assert s.family == PARAMETER_SERVER and s.family in FAMILIES
        assert s.ranks == Ranks(servers=True, data=True, stats=True)
        assert s.summary and s.protocol is not None


def test_unknown_name_lists_the_choices():
    with pytest.raises(ConfigError, match="protocol.name = 'bsp': expected one of hardsync, "):
        lookup("bsp")


def test_every_parameter_is_a_typed_protocol_key_with_the_same_default():
    hints = typing.get_type_hints(ProtocolConfig)
    defaults = ProtocolConfig()
    assert set(strategies.params()) == set(hints) - {"name"}  # no key without an owner
    for key, p in strategies.params().items():
        assert hints[key] is p.type, key
        assert getattr(defaults, key) == p.default, key
        assert p.bound in (None, "> 0", ">= 0"), key


@pytest.mark.parametrize(
    "name, own", [("hardsync", {"ref_batch"}), ("softsync", {"n"}), ("async", set()),
                  ("psp", {"c", "tau1"}), ("ssp", {"s"})],
)
def test_own_and_shared_parameters(name, own):
    s = lookup(name)
    assert {p.key for p in s.params} == own
    assert {p.key for p in s.shared} == {"lr_policy", "pull_fraction", "tau2", "pull_timestamp"}
    assert all(s.uses(k) for k in own) and not s.uses("name")


@pytest.mark.parametrize("key", [f"protocol.{k}" for k, p in strategies.params().items()
                                 if p.bound])
def test_bounds_come_from_the_registry(key):
    name = strategies.owners(key.split(".")[1])[0]
    bound = strategies.params()[key.split(".")[1]].bound
    with pytest.raises(ConfigError, match=f"{key} = -1.*expected a value {bound}"):
        load_config(None, [f"protocol.name={name}", f"{key}=-1"])


@pytest.mark.parametrize(
    "name, kind", [("hardsync", Hardsync), ("softsync", Softsync), ("async", Softsync),
                   ("psp", PartialPush), ("ssp", StaleSynchronous)],
)
def test_protocol_factory_and_waits_for_update_agree(name, kind):
    cfg = load_config(None, [f"protocol.name={name}"])
    p = make_protocol(cfg, 4)
    assert isinstance(p, kind)
    assert p.waits_for_update == lookup(name).waits_for_update  # the learner reads the latter


def test_old_entry_point_still_builds_the_protocol():
    from pserver.protocols import make_protocol as old

    assert isinstance(old(load_config(None, ["protocol.name=psp"]), 3), PartialPush)


def test_a_strategy_without_shard_protocol_refuses_to_build_one():
    cfg = load_config(None)
    gossip = Strategy("gossip", COLLECTIVE, "learners only", protocol=None, ranks=Ranks(False))
    REGISTRY["gossip"] = gossip
    try:
        with pytest.raises(ConfigError, match="runs no server shards"):
            make_protocol(replace(cfg, protocol=replace(cfg.protocol, name="gossip")), 4)
    finally:
        del REGISTRY["gossip"]


@pytest.mark.parametrize(
    "name, blocking, overlapped", [("hardsync", PS, PS_OVERLAP), ("softsync", PS, PS_OVERLAP),
                                   ("async", PS, PS_OVERLAP), ("psp", PS, PS_OVERLAP),
                                   ("ssp", PS, None)],
)
def test_exchange_by_comm_mode(name, blocking, overlapped):
    s = lookup(name)
    assert s.exchange("blocking") == blocking
    for mode in ("thread", "nonblocking"):
        if overlapped:
            assert s.exchange(mode) == overlapped
        else:
            with pytest.raises(ConfigError, match=f'comm.mode = \'{mode}\'.*"blocking"'):
                s.exchange(mode)


def test_ssp_refuses_overlapped_learners_at_validation():
    with pytest.raises(ConfigError, match="ssp's bound does not allow"):
        load_config(None, ["protocol.name=ssp", "comm.mode=thread"])
    with pytest.raises(ConfigError, match=r"partial pulling \(protocol.pull_fraction < 1\)"):
        load_config(None, ["comm.mode=thread", "protocol.pull_fraction=0.5"])


@pytest.mark.parametrize("name", NAMES)
def test_tree_only_where_the_descriptor_allows_it(name):
    overrides = [f"protocol.name={name}", "cluster.tree_fanout=2"]
    if lookup(name).tree:
        load_config(None, overrides)
    else:
        with pytest.raises(ConfigError, match="cluster.tree_fanout: aggregators sum"):
            load_config(None, overrides)


@pytest.mark.parametrize("name", NAMES)
def test_lr_policy_of_round_strategies(name):
    overrides = [f"protocol.name={name}", "protocol.lr_policy=mean"]
    if lookup(name).waits_for_update:  # hardsync, psp: refused before the world size is known
        with pytest.raises(ConfigError, match=f"does not apply to {name}"):
            load_config(None, overrides)
    else:
        assert load_config(None, overrides).protocol.lr_policy == "mean"


@pytest.mark.parametrize("name", NAMES)
def test_pull_timestamp_auto_follows_waits_for_update(name):
    cfg = load_config(None, [f"protocol.name={name}", "protocol.pull_fraction=0.5",
                             "blocks.count=4"])
    assert pull_timestamp(cfg) == ("iteration" if lookup(name).waits_for_update else "block")


def test_servers_come_from_the_descriptor():
    with pytest.raises(ConfigError, match="cluster.servers = 0: expected a value > 0; "
                       "protocol.name = 'hardsync' keeps the model on parameter-server shards"):
        load_config(None, ["cluster.servers=0"])
    cfg = load_config(None)
    learners_only = Strategy("allreduce", COLLECTIVE, "x", None, ranks=Ranks(servers=False))
    check_ranks(learners_only, replace(cfg, cluster=replace(cfg.cluster, servers=0)))
    with pytest.raises(ConfigError, match="runs without parameter-server shards"):
        check_ranks(learners_only, cfg)


def test_docs_list_every_strategy_and_key():
    text = (DOCS / "config.md").read_text()
    section = text.split("## `[protocol]`")[1].split("\n## ")[0]
    for s in REGISTRY.values():
        assert f"`{s.name}`" in section, s.name
        for p in s.params + s.shared:
            assert f"| `{p.key}` |" in section, p.key
    arch = (DOCS / "architecture.md").read_text()
    assert "## Adding a strategy" in arch


def test_layout_without_servers_for_a_learners_only_strategy():
    from pserver.plan.topology import Role, make_layout

    cfg = load_config(None)
    layout = make_layout(4, replace(cfg, cluster=replace(cfg.cluster, servers=0)))
    assert layout.servers == () and layout.members(Role.SERVER) == ()
    assert [layout.describe(r) for r in range(4)] == [
        "stats server", "data server", "learner 0", "learner 1"]
    assert [layout.index(r) for r in range(4)] == [0, 0, 0, 1]


def test_adpsgd_is_learners_only_and_needs_two_learners():
    from mpirun import QUICKSTART

    cfg = load_config(QUICKSTART, ['protocol.name="adpsgd"'])  # switched by its name alone
    assert cfg.cluster.servers == 0
    s = lookup("adpsgd")
    assert s.family == COLLECTIVE and s.ranks == Ranks(servers=False)
    assert s.protocol is None and s.min_learners == 2 and not s.tree
    assert {s.exchange(m) for m in ("blocking", "nonblocking", "thread")} == {"gossip"}
    with pytest.raises(ConfigError, match="lr_policy = 'mean' does not apply to adpsgd"):
        load_config(None, ['protocol.name="adpsgd"', 'protocol.lr_policy="mean"'])
    with pytest.raises(ConfigError, match="cluster.tree_fanout configures parameter-server"):
        load_config(None, ['protocol.name="adpsgd"', "cluster.tree_fanout=2"])


def test_adpsgd_in_every_mode_needs_thread_multiple():
    from mpi4py import MPI

    from pserver.runtime.context import THREAD_LEVELS, check_exchange_thread

    levels = {name: getattr(MPI, name) for name in THREAD_LEVELS}
    for mode in ("blocking", "nonblocking", "thread"):
        cfg = load_config(None, ['protocol.name="adpsgd"', f'comm.mode="{mode}"'])
        check_exchange_thread(cfg, levels["THREAD_MULTIPLE"], levels)
        with pytest.raises(ConfigError, match="'adpsgd' runs its exchange in a communication "
                           "thread .* needs MPI_THREAD_MULTIPLE"):  # fmt: skip
            check_exchange_thread(cfg, levels["THREAD_SERIALIZED"], levels)

"""A key the chosen strategy, data source or model kind does not use: refused with one line
naming what it belongs to when typed on the command line, listed once at start when it comes
from the config file (pserver/plan/unused.py; issue 25: one file serves a comparison). Before
the registry every one of these was accepted in silence."""

from __future__ import annotations

from pathlib import Path

import pytest

from pserver import strategies
from pserver.errors import ConfigError
from pserver.plan.config import load_config, unread
from pserver.plan.unused import rules, unread_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["protocol.c=2"], 'protocol.c = 2 belongs to psp; protocol.name = "hardsync" does not '
         "use it"),
        (["protocol.name=async", "protocol.s=1"], 'protocol.s = 1 belongs to ssp; protocol.name '
         '= "async" does not use it'),
        (["protocol.name=ssp", "protocol.tau1=0.5"], "protocol.tau1 = 0.5 belongs to psp;"),
        (["protocol.name=softsync", "protocol.ref_batch=64"], "protocol.ref_batch = 64 belongs "
         "to hardsync;"),
        (["data.path=x.h5"], 'data.path = "x.h5" belongs to data.source = "hdf5"; data.source = '
         '"digits" does not use it'),
        (["data.source=hdf5", "data.path=x.h5", "data.n_samples=100"], 'data.n_samples = 100 '
         'belongs to data.source = "synthetic"; data.source = "hdf5" does not use it'),
        (["data.test_path=t.h5"], "data.test_path"),
        (["data.n_features=8"], "data.n_features = 8 belongs to"),
        (["model.channels=[4, 8]"], 'model.channels = [4, 8] belongs to model.kind = "cnn"; '
         'model.kind = "mlp" does not use it'),
        (["model.kind=cnn", "model.size_mib=2"], 'model.size_mib = 2.0 belongs to model.kind = '
         '"null"'),
    ],
)
def test_unused_key_is_refused_naming_its_owner(overrides, line):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert line in str(info.value)
    assert "\n" not in str(info.value)


def test_a_key_in_the_file_counts_as_set_even_at_its_default(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[protocol]\nname = "hardsync"\ns = 3\nc = 2\n')
    cfg = load_config(path)  # a comparison's file: listed, not refused
    assert unread(cfg) == ["protocol.c = 2 (psp)", "protocol.s = 3 (ssp)"]
    assert "protocol.c = 2 (psp), protocol.s = 3 (ssp)" in unread_line(unread(cfg))
    assert load_config(path, ["protocol.name=psp"]).protocol.c == 2
    assert load_config(None).given == frozenset()  # defaults are not "set"


def test_the_same_key_typed_on_the_command_line_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[protocol]\nname = "hardsync"\n')
    with pytest.raises(ConfigError, match='protocol.s = 3 belongs to ssp; protocol.name = '
                       '"hardsync" does not use it'):
        load_config(path, ["protocol.s=3"])
    # issue 25: an explicitly typed protocol.n on async was only a warning
    with pytest.raises(ConfigError, match='protocol.n = 4 belongs to softsync; protocol.name = '
                       '"async" does not use it'):
        load_config(ROOT / "examples" / "quickstart.toml", ["protocol.name=async", "protocol.n=4"])


@pytest.mark.parametrize(
    "overrides, entry",
    [
        ([], "protocol.n = 1 (softsync)"),
        (["model.kind=null"], 'model.hidden = [64] (model.kind = "mlp")'),
        (["data.source=hdf5", "data.path=x.h5", "data.test_path=t.h5"],
         "data.test_fraction = 0.25 (splitting the data (data.test_path empty))"),
        (["protocol.name=bmuf"], "protocol.lr_policy = \"auto\""),
    ],
)
def test_file_keys_of_other_choices_are_listed(overrides, entry):
    cfg = load_config(ROOT / "examples" / "quickstart.toml", overrides)
    assert any(e.startswith(entry) for e in unread(cfg)), unread(cfg)


def test_used_keys_are_not_listed():
    cfg = load_config(ROOT / "examples" / "quickstart.toml", ["protocol.name=softsync"])
    assert unread(cfg) == []


def test_prediction_keys_of_the_file_without_predict_are_listed_once(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[protocol]\nname = "async"\npredict_steps = 2\n')
    assert unread(load_config(path)) == ["protocol.predict_steps = 2 (protocol.predict = true "
                                         "(PP-ASGD))"]
    with pytest.raises(ConfigError, match="protocol.predict_steps = 2 belongs to"):
        load_config(path, ["protocol.predict_steps=2"])


def run_configs() -> list[str]:
    """The shipped run configs: every ``examples/*.toml`` but the study files (``[study]``,
    read by ``pserver-study``, not ``pserver-run``)."""
    paths = sorted((ROOT / "examples").glob("*.toml"))
    return [p.name for p in paths if "\n[study]" not in "\n" + p.read_text()]


@pytest.mark.parametrize("name", strategies.names())
@pytest.mark.parametrize("example", run_configs())
def test_every_example_serves_every_strategy_by_protocol_name_alone(example, name):
    """Issue 25: a file's keys of other strategies are listed, not refused (psp.toml's shards
    and blocks are set aside for the learners-only strategies)."""
    path = ROOT / "examples" / example
    load_config(path)
    cfg = load_config(path, [f"protocol.name={name}"])
    assert cfg.protocol.name == name


def test_every_rule_is_documented():
    text = (ROOT / "docs" / "config.md").read_text()
    section = text.split("### Keys the run does not use")[1].split("\n## ")[0]
    for rule in rules():
        assert f"`{rule.key}`" in section, rule.key

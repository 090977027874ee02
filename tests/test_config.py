import pytest

from pserver.errors import ConfigError
from pserver.plan.config import load_config, parse_override


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_file_and_overrides_in_precedence(tmp_path):
    p = write(tmp_path, '[protocol]\nname = "softsync"\nn = 2\n[optim]\nlr = 0.5\n')
    cfg = load_config(p, ["protocol.n=4", "model.hidden=[32, 16]", "run.name=abc"])
    assert cfg.protocol.name == "softsync"
    assert cfg.protocol.n == 4
    assert cfg.optim.lr == 0.5
    assert cfg.model.hidden == [32, 16]
    assert cfg.run.name == "abc"
    assert cfg.data.batch_size == 32  # default kept


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("protocol.bogus=1", "unknown config key protocol.bogus"),
        ("nosuch.key=1", "unknown config section [nosuch]"),
        ("protocol.n=two", "protocol.n = 'two': expected an integer"),
        ("protocol.name=sometimes", "expected one of hardsync, softsync, async"),
        ("optim.lr=-1", "optim.lr = -1.0: expected a value > 0"),
        ("data.test_fraction=1.5", "data.test_fraction"),
        ("optim.lr_milestones=[10,5]", "optim.lr_milestones = [10, 5]: expected increasing"),
        ("optim.lr_milestones=[0]", "expected increasing epochs >= 1"),
        ("optim.lr_milestones=[3,3]", "expected increasing epochs >= 1"),
        ("optim.lr_gamma=0", "optim.lr_gamma = 0.0: expected a value > 0"),
        ("data.source=hdf5", "needs data.path"),
        ("noequals", "section.key=value"),
    ],
)
def test_bad_values_name_key_and_accepted(override, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(None, [override])
    assert fragment in str(info.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[run\n"))


def test_override_values_are_toml():
    assert parse_override("optim.lr=1e-3") == ("optim.lr", 1e-3)
    assert parse_override("stats.progress=false") == ("stats.progress", False)
    assert parse_override("protocol.name=async") == ("protocol.name", "async")


@pytest.mark.parametrize("key", ["protocol.s", "protocol.c", "protocol.tau1", "protocol.tau2"])
def test_negative_protocol_parameters_rejected(key):
    with pytest.raises(ConfigError, match=f"{key} = -1"):
        load_config(None, [f"{key}=-1"])


def test_every_config_key_is_documented():
    from pathlib import Path

    from pserver.plan.config import Config

    docs = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    for section, table in Config().to_dict().items():
        for key in table:
            assert f"{section}.{key}" in docs or f"`{key}`" in docs, f"{section}.{key}"


@pytest.mark.parametrize(
    "overrides",
    [
        ["comm.mode=thread"],
        ["comm.mode=nonblocking"],
        ["cluster.tree_fanout=2"],
        ["protocol.pull_fraction=0.5", "blocks.count=4"],
    ],
)
def test_shared_transport_refused_where_a_slot_could_be_overwritten(overrides):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(None, ["comm.transport=shm", *overrides])
    assert 'comm.transport = "shm"' in str(info.value)
    load_config(None, ["comm.transport=shm"])  # blocking, flat, full pulls: accepted


LEVELS = {"THREAD_SINGLE": 0, "THREAD_FUNNELED": 1, "THREAD_SERIALIZED": 2, "THREAD_MULTIPLE": 3}


@pytest.mark.parametrize("provided", [0, 1, 2])
def test_thread_mode_refused_without_thread_multiple(provided):
    from pserver.runtime.context import check_thread_level

    with pytest.raises(ConfigError, match="needs MPI_THREAD_MULTIPLE.*provides MPI_THREAD_"):
        check_thread_level("thread", provided, LEVELS)
    for mode in ("blocking", "nonblocking"):  # one thread calls MPI at a time: any level
        check_thread_level(mode, provided, LEVELS)
    check_thread_level("thread", 3, LEVELS)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("comm.poll_max=1000", "comm.poll_max = 1000.0: expected at most 1.0 s"),
        ("comm.poll_min=1000", "comm.poll_min = 1000.0 exceeds comm.poll_max"),
        ("data.n_classes=100000000000", "data.n_classes = 100000000000: expected at most"),
        ("model.size_mib=1e300", "model.size_mib = 1e+300: expected at most"),
        ("inject.fail_learner=-5", "inject.fail_learner = -5: expected -1 (none)"),
        ("inject.fail_step=-1", "inject.fail_step = -1: expected a value >= 0"),
    ],
)
def test_bounds_refused(override, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert fragment in str(info.value)


def test_fail_learner_checked_against_the_learners_like_slow_learner():
    from pserver.plan.config import check_fail_learner

    cfg = load_config(None, ["inject.fail_learner=99"])
    with pytest.raises(ConfigError, match=r"inject.fail_learner = 99: expected -1 \(none\) or one "
                       r"of learners 0..3"):
        check_fail_learner(cfg, 4)
    check_fail_learner(load_config(None, ["inject.fail_learner=3"]), 4)


def test_config_path_that_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory, expected a TOML file"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    "text", ["[run]\nname = " + "[" * 5000 + "]" * 5000, "[run]\nname = " + "{a=" * 5000 + "1"
             + "}" * 5000, "[run]\n" + "name." * 5000 + "x = 1"],
    ids=["lists", "inline-tables", "dotted-keys"],
)
def test_configs_nested_thousands_deep_get_one_line(tmp_path, text):
    with pytest.raises(ConfigError, match="nests tables or lists thousands of levels deep"):
        load_config(write(tmp_path, text))


def test_override_nested_thousands_deep():
    with pytest.raises(ConfigError, match="thousands of levels deep"):
        load_config(None, ["model.hidden=" + "[" * 5000 + "]" * 5000])


def test_a_control_character_in_run_name_is_refused() -> None:
    """It names a directory of run.out_dir: "a\\nb" made one with a newline (issue 22, D10)."""
    with pytest.raises(ConfigError, match=r"run.name = 'a\\nb': expected no control character"):
        load_config(None, ['run.name="a\\nb"'])

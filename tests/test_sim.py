"""pserver-sim (pserver/sim/): the simulated dump passes the dump's checks for every simulated
strategy, bad input is one line and exit 2, both event loops agree, the cost-model fit
recovers the parameters a dump was simulated with. No MPI: the simulator imports none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pserver.dump.check import check_dump
from pserver.dump.reader import load_dump
from pserver.plan.config import SimConfig, load_config
from pserver.sim.calibrate import calibrate
from pserver.sim.engine import simulate

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "examples" / "quickstart.toml")
TIMEOUT = 120

STRATEGIES = {
    "async": ["protocol.name=async"],
    "softsync": ["protocol.name=softsync", "protocol.n=2"],
    "hardsync": ["protocol.name=hardsync"],
    "psp": ["protocol.name=psp", "protocol.c=2", "protocol.tau1=0.0005"],
    "ssp": ["protocol.name=ssp", "protocol.s=1"],
}


def sim(tmp_path: Path, *overrides: str, name: str = "run") -> Path:
    cfg = load_config(QUICK, [f"run.out_dir={tmp_path / name}", "run.epochs=2",
                              "cluster.learners=4", "sim.compute_cv=0.5", *overrides])
    return simulate(cfg).dump


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_simulated_dump_is_consistent(tmp_path, strategy):
    dump = load_dump(sim(tmp_path, *STRATEGIES[strategy],
                         "inject.pull_delay_prob=0.05", "inject.pull_delay=0.01"))
    assert check_dump(dump) == []
    assert dump.attrs["protocol"] == strategy and "simulated" in dump.attrs
    assert dump.rows("updates") > 0 and dump.rows("delays") > 0
    # the epochs were trained: 2 × n_train samples entered updates
    assert dump.group("blocks")["applied"][0] * 16 >= 2 * 1347
    assert np.all(np.isnan(dump.group("train")["loss"]))  # nothing computed, and it says so


def test_pserver_stats_check_and_summary_read_a_simulated_run(tmp_path):
    dump = sim(tmp_path, "protocol.name=softsync", "protocol.n=2")
    for cmd in ("check", "summary"):
        out = subprocess.run([sys.executable, "-m", "pserver.stats.cli", cmd, str(dump.parent)],
                             capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
        assert out.returncode == 0, out.stderr
    assert "consistent" in subprocess.run(
        [sys.executable, "-m", "pserver.stats.cli", "check", str(dump)], capture_output=True,
        text=True, timeout=TIMEOUT, cwd=ROOT).stdout


def test_hardsync_rounds_take_every_learner_with_no_staleness(tmp_path):
    d = load_dump(sim(tmp_path, "protocol.name=hardsync"))
    up, g = d.group("updates"), d.group("gradients")
    assert np.all(up["n_gradients"] == 4)
    assert np.array_equal(up["vector_clock"], np.repeat(up["timestamp"][:, None] - 1, 4, 1))
    assert np.all(g["staleness"][g["update"] != -1] == 0)


def test_async_staleness_is_lambda_minus_one_in_steady_state(tmp_path):
    d = load_dump(sim(tmp_path, "protocol.name=async", "sim.compute_cv=0"))
    sigma = d.group("staleness")["staleness"]
    assert sigma.max() == 3 and np.mean(sigma[10:]) == 3.0  # λ − 1, Rudra §V-A (equal learners)


def test_both_event_loops_give_the_same_dump(tmp_path):
    a = load_dump(sim(tmp_path, "protocol.name=psp", "protocol.c=3", "protocol.tau1=0.0004",
                      "sim.loop=heap", name="heap"))
    b = load_dump(sim(tmp_path, "protocol.name=psp", "protocol.c=3", "protocol.tau1=0.0004",
                      "sim.loop=simpy", name="simpy"))
    for group in ("updates", "gradients", "train", "learners"):
        for col, values in a.group(group).items():
            assert np.array_equal(values, b.group(group)[col], equal_nan=True), (group, col)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["cluster.learners=4", "protocol.name=async", "comm.mode=thread", "sim.polls=true"],
         "sim.polls is not simulated"),
        (["cluster.learners=0"], "cluster.learners = 0"),
        (["cluster.learners=4", "blocks.count=100000"], "blocks.count = 100000 exceeds"),
        (["cluster.learners=4", "cluster.servers=3", "blocks.count=2"],
         "cannot feed cluster.servers = 3"),
        (["cluster.learners=4", "sim.bandwidth=0"], "sim.bandwidth = 0.0"),
        (["cluster.learners=4", "sim.loop=fast"], "sim.loop = 'fast'"),
        (["cluster.learners=4", "--calibrate", "no/such/run"], "no such dump file"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, overrides, says):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "pserver.sim.cli", QUICK, f"run.out_dir={out}", *overrides],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("pserver-sim: error: ")
    assert says in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_the_simulator_imports_no_mpi():
    code = ("import sys, pserver.sim.cli, pserver.sim.engine, pserver.sim.calibrate; "
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=ROOT)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("strategy", ["async", "hardsync"])  # hardsync: pulls wait for rounds
def test_the_fit_recovers_the_cost_model_a_dump_was_simulated_with(tmp_path, strategy):
    known = {"compute": 0.004, "compute_cv": 0.2, "step_overhead": 1e-4, "latency": 5e-4,
             "latency_cv": 0.5, "message_time": 3e-5, "start_time": 0.15, "end_time": 0.05}
    # 12 epochs: ~1,000 pulls, so that the quartiles behind latency_cv are within ~5 %
    dump = sim(tmp_path, f"protocol.name={strategy}", "inject.compute_time=0.01", "run.epochs=12",
               *(f"sim.{k}={v}" for k, v in known.items()))
    fitted = calibrate(dump.parent, SimConfig())
    for key, value in known.items():
        assert getattr(fitted, key) == pytest.approx(value, rel=0.1), key
    assert fitted.bandwidth == SimConfig().bandwidth  # not identifiable: kept


def test_rows_written_in_batches_give_the_same_dump(tmp_path, monkeypatch):
    import pserver.sim.rows as rows

    whole = load_dump(sim(tmp_path, "protocol.name=softsync", "protocol.n=2", name="whole"))
    monkeypatch.setattr(rows, "BATCH", 7)  # many appends of every group, clocks with them
    parts = load_dump(sim(tmp_path, "protocol.name=softsync", "protocol.n=2", name="parts"))
    assert whole.rows("gradients") > 7 * 10
    for group in ("updates", "gradients", "staleness", "train", "learners"):
        for col, values in whole.group(group).items():
            assert np.array_equal(values, parts.group(group)[col], equal_nan=True), (group, col)
    assert check_dump(parts) == []


def test_two_hundred_learners_under_ssp_stay_within_the_bound(tmp_path):
    keys = ("cluster.learners=200", "data.source=synthetic", "data.n_samples=40000",
            "inject.slow_learner=0", "inject.learner_factor=3", "sim.compute=0.01")
    spread = {}
    for name, protocol in (("async", ["protocol.name=async"]),
                           ("ssp", ["protocol.name=ssp", "protocol.s=2"])):
        d = load_dump(sim(tmp_path, *protocol, *keys, name=name))
        assert check_dump(d) == []
        counts = np.bincount(d.group("train")["learner"], minlength=200)
        spread[name] = int(counts.max() - counts.min())
    # SSP (Ho et al.): a pull is answered only while the learner is at most s clocks ahead of
    # the slowest, so no learner computes more than s + 1 minibatches beyond the slow one;
    # without the bound the slow learner (3x) falls far behind
    assert spread["ssp"] <= 2 + 1 < spread["async"]

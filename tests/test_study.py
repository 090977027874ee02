"""pserver-study's bookkeeping in one process: the grid, each strategy's rank count, the rate
choice, resumability and the table's arithmetic (pserver/plan/study.py, pserver/job/study.py)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import h5py
import pytest
from mpirun import QUICKSTART

from pserver.errors import ConfigError
from pserver.job import launcher
from pserver.job import study as job
from pserver.plan import study as plan
from pserver.plan.config import load_config


def spec(**study) -> dict:
    top = {"config": str(QUICKSTART), **study}
    return {"study": top, "strategies": {"hardsync": {}, "async": {"lr": [0.1, 0.3, 0.9]}}}


def test_grid_strategies_by_rates_by_seeds():
    s = plan.parse(spec(lr=[0.01, 0.05], sweep_seeds=2))
    assert s.seeds == (0, 1, 2)  # the default: three seeds
    sweep = plan.sweep_runs(s)
    assert len(sweep) == 2 * 2 + 3 * 2  # hardsync: 2 rates, async its own 3; 2 seeds each
    assert {r.lr for r in sweep if r.strategy == "async"} == {0.1, 0.3, 0.9}
    finals = plan.final_runs(s, {"hardsync": 0.05, "async": 0.3})
    assert [(r.strategy, r.seed, r.lr) for r in finals][:4] == [
        ("hardsync", 0, 0.05), ("hardsync", 1, 0.05), ("hardsync", 2, 0.05), ("async", 0, 0.3)]
    assert len({r.name for r in sweep + finals}) == len(sweep + finals)  # one directory each


def test_one_rate_or_none_is_no_sweep():
    s = plan.parse({"study": {"config": "c.toml", "seeds": [5, 7]},
                    "strategies": {"sync": {"lr": [0.2]}, "bmuf": {}}})
    assert plan.sweep_runs(s) == []
    assert plan.choose_rates(s, lambda r: None) == {"sync": 0.2, "bmuf": None}


def test_job_overrides_put_the_studys_keys_last():
    s = plan.parse(spec(validation=0.25, overrides=["run.epochs=2"]))
    st = s.strategies[1]
    sweep = plan.Run("async", plan.SWEEP, 4, 0.3)
    args = plan.job_overrides(s, st, sweep)
    assert args == ["run.epochs=2", "protocol.name=async", "cluster.learners=4", "run.seed=4",
                    "optim.lr=0.3", "data.validation=0.25"]
    final = plan.job_overrides(s, st, plan.Run("async", plan.FINAL, 4, None))
    assert "data.validation=0.0" in final and not any(a.startswith("optim.lr") for a in final)


@pytest.mark.parametrize(
    "study, strategies, message",
    [
        ({}, {"a": {}}, "study.config is missing"),
        ({"config": "c", "lr": [0.1, 0.1]}, {"a": {}}, "distinct learning rates"),
        ({"config": "c", "seeds": 0}, {"a": {}}, "study.seeds = 0"),
        ({"config": "c", "bogus": 1}, {"a": {}}, "unknown key study.bogus"),
        ({"config": "c"}, {}, "no strategy"),
        ({"config": "c"}, {"a": {"overrides": ["optim.lr=1"]}}, "optim.lr and run.seed"),
        ({"config": "c", "validation": 1.5}, {"a": {}}, "study.validation = 1.5"),
        ({"config": "c", "sweep_seeds": 4}, {"a": {}}, "study.sweep_seeds = 4"),
    ],
)
def test_bad_study_files_are_one_error(study, strategies, message):
    with pytest.raises(ConfigError, match=message):
        plan.parse({"study": study, "strategies": strategies})


@pytest.mark.parametrize(
    "overrides, n",
    [
        (["protocol.name=hardsync"], 7),  # 1 shard + stats + data + 4
        (["protocol.name=sync"], 6),  # learners only
        (["protocol.name=async", "cluster.servers=2"], 8),
        (["protocol.name=hardsync", "cluster.tree_fanout=2"], 9),  # + 2 aggregators
    ],
)
def test_rank_count_follows_from_lambda_through_the_layout(overrides, n):
    cfg = load_config(QUICKSTART, [*overrides, "cluster.learners=4"])
    assert plan.world_size(cfg) == n


def test_rate_with_the_lowest_mean_validation_error_is_chosen():
    s = plan.parse(spec(lr=[0.01, 0.05], seeds=2))
    errors = {0.01: [0.20, 0.30], 0.05: [0.24, 0.24], 0.1: [None, 0.1], 0.3: [0.5, 0.5],
              0.9: [None, None]}
    chosen = plan.choose_rates(s, lambda r: errors[r.lr][r.seed])
    assert chosen == {"hardsync": 0.05, "async": 0.1}  # 0.24 < 0.25; a missing run is left out


def test_mean_std_target_and_table_arithmetic():
    assert plan.mean_std([1.0, 2.0, None, 3.0]) == (2.0, 1.0)  # sample deviation, n - 1
    assert plan.mean_std([4.0]) == (4.0, 0.0) and plan.mean_std([None]) == (None, None)
    assert plan.to_target([0.5, 0.2, 0.09, 0.12], [1, 2, 3, 4], 0.1) == 3
    assert plan.to_target([0.5], [1], 0.1) is None and plan.to_target([0.5], [1], None) is None
    runs = [{"final_error": 0.10, "best_error": 0.08, "time_to_target": 30.0,
             "samples_to_target": 6e4, "mean_staleness": 0.0, "samples_per_s": 2000.0},
            {"final_error": 0.12, "best_error": 0.10, "time_to_target": None,
             "samples_to_target": None, "mean_staleness": 0.0, "samples_per_s": 1000.0}]
    agg = plan.aggregate(runs)
    assert agg["reached"] == 1 and agg["time_to_target"] == (30.0, 0.0)
    assert agg["final_error"][0] == pytest.approx(0.11)
    assert agg["final_error"][1] == pytest.approx(math.sqrt(2) * 0.01)
    text = plan.table([("hardsync", 0.05, agg)], 0.1)
    row = text.splitlines()[2]
    assert "| hardsync | 0.05 | 2 | 11.00 ± 1.41 | 9.00 ± 1.41 | 30.0 ± 0.0 (1/2) |" in row
    assert "1500 ± 707" in row and "time to 10% s" in text


def fake_dump(path: Path, errors: list[float], finished: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs["pserver_version"] = "test"
        if finished:
            f.attrs["finished"] = "2026-01-01T00:00:00"
            f.attrs["wall_time"] = 10.0 * len(errors)
        g = f.create_group("test")
        g["error"] = errors
        g["time"] = [10.0 * (i + 1) for i in range(len(errors))]
        g["samples"] = [1000 * (i + 1) for i in range(len(errors))]


def test_finished_runs_are_not_run_again(tmp_path, monkeypatch):
    s = plan.parse({"study": {"config": str(QUICKSTART), "seeds": 2, "target": 0.3,
                              "lr": [0.1, 0.2]},
                    "strategies": {"hardsync": {}}})
    ran: list[str] = []

    def fake_run(cmd, env=None, timeout=None, grace=0, log=None, signaller=None):  # writes a dump
        out = next(a.split("=", 1)[1] for a in cmd if a.startswith("run.out_dir="))
        lr = float(next(a.split("=", 1)[1] for a in cmd if a.startswith("optim.lr=")))
        ran.append(Path(out).relative_to(tmp_path / "runs").as_posix())
        fake_dump(Path(out) / "stats.h5", [0.5, 0.1 + lr, 0.4])
        Path(log).write_text("")
        return launcher.Outcome(0)

    monkeypatch.setattr(launcher, "execute", fake_run)
    fake_dump(tmp_path / "runs/hardsync/sweep-lr0.2-seed1/stats.h5", [0.9], finished=False)
    fake_dump(tmp_path / "runs/hardsync/sweep-lr0.1-seed0/stats.h5", [0.5, 0.2, 0.4])
    assert job.run_study(s, {"hardsync": 7}, tmp_path) == []
    assert ran == ["hardsync/sweep-lr0.1-seed1",  # seed 0 had finished
                   "hardsync/sweep-lr0.2-seed0", "hardsync/sweep-lr0.2-seed1",  # unfinished
                   "hardsync/final-lr0.1-seed0", "hardsync/final-lr0.1-seed1"]
    ran.clear()
    assert job.run_study(s, {"hardsync": 7}, tmp_path) == [] and ran == []  # nothing new
    with open(tmp_path / "study.csv") as f:
        (row,) = csv.DictReader(f)
    assert (row["strategy"], row["lr"], row["seeds"], row["reached_target"]) == (
        "hardsync", "0.1", "2", "2")
    assert float(row["final_error_mean"]) == 0.4 and float(row["best_error_mean"]) == 0.2
    assert float(row["time_to_target_mean"]) == 20.0  # the second test, at 10 s per test
    assert float(row["samples_to_target_mean"]) == 2000.0 and row["mean_staleness_mean"] == ""
    for name in ("table.md", "runs.csv", "error_vs_time.png", "error_vs_samples.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_a_diverged_rate_loses_the_sweep_and_is_not_run_again(tmp_path, monkeypatch):
    s = plan.parse({"study": {"config": str(QUICKSTART), "seeds": 1, "lr": [0.1, 9.0]},
                    "strategies": {"async": {}}})
    ran: list[str] = []

    def fake_run(cmd, env=None, timeout=None, grace=0, log=None, signaller=None):
        out = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("run.out_dir=")))
        ran.append(out.name)
        if "optim.lr=9.0" in cmd:  # what pserver-run prints when the loss becomes NaN
            Path(log).write_text("pserver-run: rank 3: the run diverged; try …")
            return launcher.Outcome(1)
        fake_dump(out / "stats.h5", [0.3, 0.2])
        Path(log).write_text("")
        return launcher.Outcome(0)

    monkeypatch.setattr(launcher, "execute", fake_run)
    assert job.run_study(s, {"async": 7}, tmp_path) == []  # a diverged sweep run is a result
    assert ran == ["sweep-lr0.1-seed0", "sweep-lr9-seed0", "final-lr0.1-seed0"]
    ran.clear()
    assert job.run_study(s, {"async": 7}, tmp_path) == [] and ran == []
    assert "| async | 9 | diverged | 1/1 |" in (tmp_path / "table.md").read_text()

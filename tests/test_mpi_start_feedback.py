"""Feedback at start (issue 24 item 5): a bad ``model.module`` reported before any heavy import,
one line saying what the data and the model are, and examples that can be run again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mpirun import QUICKSTART, ROOT, run_job

pytestmark = pytest.mark.mpi

TIMEOUT = 300.0  # a run of the torch example imports PyTorch on every rank (loaded machine)
HEAVY = ("torch", "scipy", "sklearn")
# a package of each heavy name that records who imported it, then refuses to be imported
RECORDER = """import os, pathlib
pathlib.Path(os.environ["HEAVY_IMPORTS"], f"{__name__}-{os.getpid()}").touch()
raise ImportError("the test's stand-in for " + __name__)
"""


def stand_ins(tmp_path: Path) -> dict[str, str]:
    """An environment in which importing torch, scipy or sklearn leaves a file in a folder."""
    fake, seen = tmp_path / "fake", tmp_path / "imported"
    seen.mkdir()
    for name in HEAVY:
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(RECORDER)
    path = os.pathsep.join([str(ROOT), str(fake)])
    return {"PYTHONPATH": path, "HEAVY_IMPORTS": str(seen)}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("examples/torch_cnn.py", "name the function or class in the file"),
        ("examples/torch_cnn.py:buld", "'examples/torch_cnn.py' has no 'buld'"),
    ],
)
def test_a_bad_model_module_is_reported_before_torch_scipy_or_sklearn(tmp_path, spec, message):
    env = stand_ins(tmp_path)
    res = run_job(7, [str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}", "model.kind=torch",
                      f"model.module={spec}"], TIMEOUT, env=env)
    assert res.returncode == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pserver-run: error:")]
    assert len(lines) == 1 and message in lines[0], res.output
    assert "Traceback" not in res.output
    assert sorted(os.listdir(env["HEAVY_IMPORTS"])) == []  # no rank imported any of them
    assert not (tmp_path / "run").exists()


def test_the_stand_ins_do_record_an_import(tmp_path):
    """The check above can fail: with a well-formed ``model.module`` the ranks go on to build
    the model, import (the stand-in of) torch, and it records that. (Synthetic 8x8 data: the
    digits' loader, finding a stand-in sklearn without its data file, would import it first.)"""
    env = stand_ins(tmp_path)
    res = run_job(7, [str(QUICKSTART), f"run.out_dir={tmp_path / 'run'}", "model.kind=torch",
                      "model.module=examples/torch_cnn.py:build", "data.source=synthetic",
                      "data.n_features=64"], TIMEOUT, env=env)
    assert res.returncode == 2 and "needs PyTorch" in res.stderr, res.output
    assert any(n.startswith("torch-") for n in os.listdir(env["HEAVY_IMPORTS"])), res.output


def model_said(example: str) -> str:
    """The model kind and parameter count the start-up line must name, built here."""
    from learners.data import describe_dataset
    from learners.models import build_model
    from pserver.plan.config import load_config

    cfg = load_config(ROOT / "examples" / example)
    if cfg.model.kind == "torch":
        cfg.model.module = str(ROOT / "examples" / "torch_cnn.py") + ":build"
    ds = describe_dataset(cfg.data, cfg.run.seed)
    n = build_model(cfg.model, ds.n_features, ds.n_classes).n_params
    kind = cfg.model.kind if cfg.model.kind == "mlp" else f"torch {cfg.model.module}"
    return f"{kind}, {n} parameters"


@pytest.mark.parametrize("example", ["quickstart.toml", "torch_cnn.toml"])
def test_an_example_runs_twice_in_the_same_place(tmp_path, example):
    """Each example's own run directory scheme (``run.out_dir`` left as the example has it),
    relative to the working directory: a second run gets a directory of its own."""
    overrides = ["run.epochs=1", "stats.progress=false"]
    if example == "torch_cnn.toml":
        pytest.importorskip("torch")
        overrides.append(f"model.module={ROOT / 'examples' / 'torch_cnn.py'}:build")
    env = {"PYTHONPATH": str(ROOT), "PSERVER_RUN_ID": ""}  # "": the start time's id
    runs: list[set[Path]] = []
    for _ in range(2):
        res = run_job(7, [str(ROOT / "examples" / example), *overrides], TIMEOUT,
                      cwd=tmp_path, env=env)
        assert res.returncode == 0, res.output
        said = [ln for ln in res.stderr.splitlines() if " INFO data: " in ln]
        assert len(said) == 1 and " stats server " in said[0], res.output  # one line, one rank
        assert f"model: {model_said(example)} in " in said[0] and " train / " in said[0]
        runs.append({p.parent.resolve() for p in tmp_path.glob("runs/*/*/stats.h5")})
    assert len(runs[0]) == 1 and len(runs[1]) == 2, runs
    (second,) = runs[1] - runs[0]
    assert next(tmp_path.glob("runs/*/latest")).resolve() == second

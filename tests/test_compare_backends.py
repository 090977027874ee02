"""scripts/compare_backends.py, run CPU against CPU (the GPU comparison runs in gpu_check.sh)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mpirun import ROOT

pytestmark = pytest.mark.mpi


def test_two_cpu_runs_of_one_learner_are_identical(tmp_path):
    out = tmp_path / "curves.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_backends.py"), "--devices", "cpu", "cpu",
         "--models", "softmax", "--dtypes", "float64", "--epochs", "1", "--quiet-idle", "0",
         "--out", str(tmp_path), "--json", str(out), "--check", "--plot", "--timeout", "120"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (r,) = json.loads(out.read_text())
    assert (r["model"], r["dtype"], r["steps"]) == ("softmax", "float64", 85)  # 1347 / 16 per epoch
    # Same seed, same minibatch order, same arithmetic: a λ = 1 run is deterministic.
    assert r["loss_max_rel"] == 0.0 and r["weights_rel"] == 0.0 and r["within"]
    assert r["test_error_ref"] == r["test_error_other"] < 0.2
    assert (tmp_path / "loss_curves.png").stat().st_size > 10_000


def test_gpu_comparison_without_a_gpu_says_skipped():
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: the GPU comparison would run")
    except ImportError:
        pass
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_backends.py")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("no GPU: skipped"), proc.stdout

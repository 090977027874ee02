"""Reading a study's runs (``pserver-study``): where each lives, whether it finished, and its
table entries and test curve, through :func:`pserver.dump.reader.load_dump` and
:func:`~pserver.dump.reader.summarize`."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from pserver.dump.reader import DumpError, load_dump, summarize
from pserver.plan import study as plan

DUMP = "stats.h5"
DIVERGED = "the run diverged"  # what pserver-run says when it stops on a NaN/infinite loss


def run_dir(out: Path, run: plan.Run) -> Path:
    return out / "runs" / run.name


def finished(out: Path, run: plan.Run) -> bool:
    """Whether the run's dump exists and says the run ended (its ``finished`` attribute)."""
    path = run_dir(out, run) / DUMP
    if not path.is_file():
        return False
    try:
        return "finished" in load_dump(path).attrs
    except DumpError:
        return False


def diverged(out: Path, run: plan.Run) -> bool:
    """Whether the run stopped on a diverged loss before (:func:`mark_diverged`)."""
    return run_dir(out, run).with_suffix(".diverged").is_file()


def mark_diverged(out: Path, run: plan.Run, output: str) -> None:
    """Remember that the run diverged (its line of the job's output), so that a study run
    again counts it as a result instead of running it again."""
    line = next((ln for ln in output.splitlines() if DIVERGED in ln), DIVERGED)
    run_dir(out, run).with_suffix(".diverged").write_text(line.strip() + "\n")


def final_error(out: Path, run: plan.Run) -> float | None:
    """The last test (here: validation) error of a finished run; infinity for a diverged
    one (its rate loses the sweep); None otherwise."""
    if diverged(out, run):
        return math.inf
    if not finished(out, run):
        return None
    return summarize(load_dump(run_dir(out, run) / DUMP))["test"].get("final_error")


def metrics(path: Path, target: float | None) -> tuple[dict[str, float | None], dict[str, Any]]:
    """A run's table entries and its test curve (time, samples, error)."""
    dump = load_dump(path)
    s = summarize(dump)
    test = dump.group("test")
    err = [float(e) for e in test.get("error", [])]
    time = [float(t) for t in test.get("time", [])]
    samples = [float(x) for x in test.get("samples", [])]
    row = {
        "final_error": s["test"].get("final_error"),
        "best_error": s["test"].get("best_error"),
        "time_to_target": plan.to_target(err, time, target) if time else None,
        "samples_to_target": plan.to_target(err, samples, target) if samples else None,
        "mean_staleness": mean_staleness(s),
        "samples_per_s": s.get("samples_per_s"),
        "wall_time": s.get("wall_time"),
    }
    return row, {"error": err, "time": time, "samples": samples}


def mean_staleness(summary: dict[str, Any]) -> float | None:
    """⟨σ⟩: the summary's ``staleness`` block where the dump reader has one (one measure for
    every family, issue 25), else the shards' gradients', else the learners' exchanges'."""
    for block in (summary.get("staleness"), summary.get("gradients", {}).get("staleness"),
                  summary.get("exchanges", {}).get("staleness")):
        if isinstance(block, dict) and block.get("count") and block.get("mean") is not None:
            return float(block["mean"])
    return None


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["strategy"])
        w.writeheader()
        w.writerows(rows)

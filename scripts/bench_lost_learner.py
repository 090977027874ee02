"""Issue 22: what losing a learner costs under Open MPI's ULFM (docs/launching.md, *Lost
learners*).

For each protocol, three jobs of the quickstart: λ = 4 with learner 2 killed by SIGKILL at
step ``--step`` (``inject.fail_kill``), and uninterrupted runs with λ = 4 and λ = 3. Printed per
protocol: the detection time (the killed learner's last log line to the first survivor's
"lost rank" line), the samples/s of the survivors before the kill and after the detection
(from the dump's ``train`` rows), the samples/s of the uninterrupted runs, and the final test
error of the three runs.

    .venv-openmpi/bin/python scripts/bench_lost_learner.py [--protocols async hardsync]
        [--step 100] [--period 0.3] [--timeout 1.0]

Every strategy that survives a lost learner can be named: the parameter-server family, BMUF
and MA (one shard: 7 ranks for λ = 4) and the learners-only SYNC, HYBRID and ADPSGD (6 ranks).
The verdict column is issue 22's acceptance for the run that lost learner 2 (finished, `check`
clean, `learners_lost` naming it with λ = 3).

Run it with the Open MPI environment's Python: the launcher is the ``mpiexec`` beside it.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from pserver.dump.reader import load_dump, summarize  # noqa: E402
from pserver.job import launch  # noqa: E402

CONFIG = ROOT / "examples" / "quickstart.toml"


def job(out: Path, n: int, protocol: str, extra: list[str], ulfm: list[str]) -> str:
    """One job's output (stdout and stderr); raises if it hung."""
    args = [str(CONFIG), f"run.out_dir={out}", f"protocol.name={protocol}", *extra]
    cmd = launch.mpi_command(n, [*launch.pserver_cli(), *args], [*launch.launcher(), *ulfm])
    res = launch.run(cmd, 600, cwd=ROOT)
    if res.reason or not (out / "stats.h5").exists():
        raise SystemExit(f"{' '.join(cmd)}: {res.reason or 'no dump'}\n{res.output[-3000:]}")
    return res.output


def ranks(protocol: str, learners: int) -> int:
    """The world size for ``learners`` learners: statistics and data servers, one shard unless
    the strategy runs learners only."""
    from pserver.strategies import lookup

    return 2 + learners + (1 if lookup(protocol).ranks.servers else 0)


def stamp(line: str) -> datetime:
    return datetime.strptime(line[:12], "%H:%M:%S.%f")


def detection(output: str) -> float:
    lines = output.splitlines()
    kill = next(ln for ln in lines if "inject.fail_kill: killing" in ln)
    seen = next(ln for ln in lines if "WARNING lost rank" in ln)
    return (stamp(seen) - stamp(kill)).total_seconds()


def rates(run: Path) -> tuple[float, float]:
    """Samples/s of every learner's train rows before the loss (from the first epoch's test
    on: the start-up is not training) and after it was seen."""
    dump = load_dump(run / "stats.h5")
    t, lost = dump.group("train")["time"], dump.group("learners_lost")
    batch = int(dump.config["data"]["batch_size"])
    seen, start = float(lost["time"][0]), float(dump.group("test")["time"][0])
    if start >= seen:  # no test before the loss (ADPSGD's first epoch average can come later)
        start = float(t.min())
    before = t[(t >= start) & (t < seen)]
    after = t[t >= seen]

    def rate(rows: np.ndarray) -> float:  # nan: no rows in that window (a loss seen early)
        return len(rows) * batch / max(rows.max() - rows.min(), 1e-9) if rows.size else np.nan

    return rate(before), rate(after)


def verdict(run: Path) -> str:
    """Issue 22's acceptance for the run that lost learner 2: ``ok`` when the dump is finished,
    ``pserver-stats check`` is clean and ``learners_lost`` lists learner 2 with λ = 3; else
    what is wrong."""
    from pserver.dump.check import check_dump

    if not (run / "stats.h5").is_file():
        return "no dump"
    dump = load_dump(run / "stats.h5")
    lost = summarize(dump)["learners_lost"]
    if "finished" not in dump.attrs:
        return "not finished"
    if problems := check_dump(dump):
        return f"check: {problems[0]}"
    if [(r["learner"], r["learners"]) for r in lost] != [(2, 3)]:
        return f"learners_lost {lost}"
    return "ok"


def final_error(run: Path) -> float:
    return float(load_dump(run / "stats.h5").group("test")["error"][-1])


def throughput(run: Path) -> float:
    """The whole run's samples/s (``pserver-stats summary``'s)."""
    return float(summarize(load_dump(run / "stats.h5"))["samples_per_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--protocols", nargs="+", default=["async", "hardsync"])
    p.add_argument("--step", type=int, default=100)
    p.add_argument("--period", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=1.0)
    a = p.parse_args()
    ulfm = ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
            "--mca", "mpi_ft_detector_period", str(a.period),
            "--mca", "mpi_ft_detector_timeout", str(a.timeout)]  # fmt: skip
    kill = ["inject.fail_learner=2", f"inject.fail_step={a.step}", "inject.fail_kill=true"]
    print("protocol  verdict  detection_s  samples/s_before  samples/s_after  samples/s_lambda4  "
          "samples/s_lambda3  error_lost  error_lambda4  error_lambda3")  # fmt: skip
    with TemporaryDirectory() as tmp:
        for proto in a.protocols:
            out = Path(tmp) / proto
            text = job(out / "lost", ranks(proto, 4), proto, kill, ulfm)
            ok = verdict(out / "lost")
            if ok != "ok":  # the acceptance failed: say why, with the job's last lines
                print(f"{proto:9s} {ok}\n" + "\n".join(text.splitlines()[-8:]))
                continue
            job(out / "four", ranks(proto, 4), proto, [], ulfm)
            job(out / "three", ranks(proto, 3), proto, ["cluster.learners=3"], ulfm)
            before, after = rates(out / "lost")
            errors = [final_error(out / r) for r in ("lost", "four", "three")]
            speeds = [throughput(out / r) for r in ("four", "three")]
            print(f"{proto:9s} {ok:7s}  {detection(text):11.3f} {before:17.0f} {after:16.0f} "
                  f"{speeds[0]:17.0f} {speeds[1]:17.0f}  "
                  + "  ".join(f"{e:10.4f}" for e in errors))
            sys.stdout.flush()


if __name__ == "__main__":
    main()

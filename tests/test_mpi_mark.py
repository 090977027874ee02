"""The ``mpi`` mark is enforced: a test that starts a launcher without it fails (conftest.py)."""

import os
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py").read_text()
VENV_BIN = Path(sys.executable).parent  # the mpiexec beside this Python (scripts/setup.sh)
BODY = """
import subprocess
import pytest

{mark}
def test_job():
    subprocess.run(["mpiexec", "-n", "1", "--version"], capture_output=True)
"""


def test_a_launch_without_the_mark_fails(pytester, monkeypatch):
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(BODY.format(mark=""))
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*launches mpiexec without @pytest.mark.mpi*"])


@pytest.mark.mpi  # it does start mpiexec (--version), in this process
def test_a_launch_with_the_mark_is_let_through(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(BODY.format(mark="@pytest.mark.mpi"))
    pytester.makeini("[pytest]\nmarkers =\n    mpi: launches a job\n")
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)

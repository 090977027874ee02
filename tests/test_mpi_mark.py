"""The ``mpi`` mark is enforced: a test that starts a launcher without it fails (conftest.py)."""

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py").read_text()
BODY = """
import subprocess
import pytest

{mark}
def test_job():
    subprocess.run(["mpiexec", "-n", "1", "--version"], capture_output=True)
"""


def test_a_launch_without_the_mark_fails(pytester):
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
    monkeypatch.setenv("PATH", str(Path(__file__).resolve().parents[1] / ".venv" / "bin"))
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)

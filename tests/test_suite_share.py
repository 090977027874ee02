"""scripts/suite_share.py: the share of a JUnit report's time in tests that launch jobs."""

from __future__ import annotations

import sys

from mpirun import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import suite_share  # noqa: E402

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_job[x]" time="6.0"/>
<testcase classname="tests.test_a" name="test_pure" time="1.5"/>
<testcase classname="tests.test_b" name="test_other" time="2.5"/>
</testsuite></testsuites>"""


def test_share_counts_the_launching_tests_and_restricts_to_a_list(tmp_path, capsys):
    (tmp_path / "r.xml").write_text(REPORT)
    (tmp_path / "jobs.txt").write_text("tests/test_a.py::test_job[x]\n")
    (tmp_path / "only.txt").write_text("tests/test_a.py::test_job[x]\ntests/test_a.py::test_pure\n")
    args = [str(tmp_path / "r.xml"), str(tmp_path / "jobs.txt")]
    assert suite_share.main(args) == 0
    assert "launching tests: 1, 6.0 s; others: 2, 4.0 s; share 60.0 % of 10.0 s" in (
        capsys.readouterr().out)
    assert suite_share.main([*args, "--only", str(tmp_path / "only.txt")]) == 0
    assert "others: 1, 1.5 s; share 80.0 % of 7.5 s" in capsys.readouterr().out


def test_a_missing_report_is_one_error_line(tmp_path, capsys):
    assert suite_share.main([str(tmp_path / "no.xml"), str(tmp_path / "no.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("suite_share: error:") and err.count("\n") == 1

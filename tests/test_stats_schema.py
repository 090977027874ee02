"""The dump schema (:mod:`pserver.dump.schema`) against docs/stats.md, the writer and a dump."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest
from mpirun import ROOT, train

from pserver.dump.schema import GROUPS, ROOT_ATTRS, VECTOR_CLOCK, as_columns
from pserver.dump.writer import StatsWriter

DOC = ROOT / "docs" / "stats.md"


def doc_tables(text: str) -> dict[str, dict[str, str]]:
    """``{section: {name: type}}`` from the tables under ``### `group/` `` and ``### Root
    attributes`` (a cell may name several columns: "`bytes_in`, `bytes_out`")."""
    out: dict[str, dict[str, str]] = {}
    section = None
    for line in text.splitlines():
        if line.startswith("#"):
            m = re.match(r"### `([a-z_]+)/`", line)
            section = m.group(1) if m else "/" if line == "### Root attributes" else None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if section is None or not line.startswith("|") or len(cells) < 3:
            continue
        if cells[0] in ("dataset", "name") or set(cells[0]) <= {"-", ":"}:
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            out.setdefault(section, {})[name] = cells[1]
    out.pop("model", None)  # model/weights: one vector of model.dtype, not a table
    return out


def mismatches(text: str) -> list[str]:
    """Where the tables of ``text`` (docs/stats.md) differ from the schema."""
    tables = doc_tables(text)
    out = []
    if set(tables) - {"/"} != set(GROUPS):
        out.append(f"groups: documented {sorted(set(tables) - {'/'})}, schema {sorted(GROUPS)}")
    for name, g in GROUPS.items():
        want = {c.name: c.dtype for c in g.columns}
        want.update({c.name: f"{c.dtype}, 2-D" for c in g.clocks})
        got = {k: v.split(" ")[0].rstrip(",") + (", 2-D" if "2-D" in v else "")
               for k, v in tables.get(name, {}).items()}  # fmt: skip
        if got != want:
            out.append(f"{name}/: documented {got}, schema {want}")
    if tables.get("/") != ROOT_ATTRS:
        out.append(f"root attributes: documented {tables.get('/')}, schema {ROOT_ATTRS}")
    return out


def test_docs_document_every_group_and_column_with_its_dtype():
    assert mismatches(DOC.read_text()) == []


@pytest.mark.parametrize(
    "old, new",
    [
        ("| `staleness` | int32 |", "| `staleness` | int64 |"),  # a wrong dtype
        ("| `lr` | float64 |", "| `lr` | float64 |\n| `momentum` | float64 |"),  # no such column
        ("| `delay` | float64 | s it was held |\n", ""),  # a column left out
        ("### `delays/`", "### `delay/`"),  # a group misnamed
        ("| `host` | string |", "| `host` | int |"),  # an attribute's type
    ],
)
def test_the_check_finds_each_kind_of_drift(old, new):
    text = DOC.read_text()
    assert old in text
    assert mismatches(text.replace(old, new, 1)) != []


def test_writer_types_schema_columns_and_refuses_unknown_ones(tmp_path):
    path = tmp_path / "s.h5"
    with StatsWriter(path, {"pserver_version": "test"}) as w:
        w.append("gradients", learner=[1, 2], staleness=[3, 4], time=[0.5, 1])
        with pytest.raises(ValueError, match="not in the dump schema"):
            w.append("gradients", learner=[1], lerner=[2])
        w.append("free_form", a=np.array([1], np.int16))  # not a schema group: kept as given
    with h5py.File(path, "r") as f:
        assert f["gradients/learner"].dtype == np.int32
        assert f["gradients/staleness"].dtype == np.int32
        assert f["gradients/time"].dtype == np.float64
        assert f["free_form/a"].dtype == np.int16


def test_records_become_columns():
    from pserver.dump.schema import Delay

    rows = [Delay(0, 1, 2, 3, 0.5, 0.1), Delay(1, 2, 0, 4, 0.6, 0.2)]
    assert as_columns(rows) == {
        "shard": [0, 1], "learner": [1, 2], "block": [2, 0], "request": [3, 4],
        "time": [0.5, 0.6], "delay": [0.1, 0.2],
    }  # fmt: skip
    assert VECTOR_CLOCK.dtype == "int64"


@pytest.mark.mpi
def test_a_real_dump_has_exactly_the_schema(tmp_path):
    """A tree run with injected pull delays writes every group but skipped_tests; each has
    exactly its schema's columns, with its dtypes."""
    train(tmp_path, 6, "run.epochs=2", "cluster.tree_fanout=2", "cluster.learners=2",
          "inject.pull_delay_prob=0.05", "inject.pull_delay=0.01")  # fmt: skip
    with h5py.File(tmp_path / "stats.h5", "r") as f:
        groups = {k for k in f if k != "model"}
        assert groups <= set(GROUPS) and {"updates", "delays", "aggregators"} <= groups
        for name in groups:
            g = GROUPS[name]
            want = {c.name: c.dtype for c in (*g.columns, *g.clocks)}
            got = {k: str(f[name][k].dtype) for k in f[name]}
            assert got == want, name
        assert set(f.attrs) <= set(ROOT_ATTRS)

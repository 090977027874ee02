"""The header's aux word: one encoder and one decoder per message kind, and nobody else reads it.

``aux`` means something else for every kind (PULL: the oldest timestamp accepted; PUSH: a
learner's iteration tag or an aggregator's count of summed gradients; REPLY: the kind and a
window version; MODEL: the epoch). A raw ``h.aux == Reply.STOP`` silently breaks when the word
gains a field (a reply with a window version is not ``== Reply.STOP``), so the code base is read
with ``ast``: outside ``pserver/comm/wire.py`` the attribute ``.aux`` is only handed whole to one of
the decoders, and a header is only built with an encoder's word.

Fails on the main of issue 10: aggregator.py and overlap.py compare ``h.aux`` with ``Reply``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from pserver.comm import wire
from pserver.comm.wire import (
    Header,
    Reply,
    Tag,
    bye_aux,
    bye_consumed,
    header_buffer,
    model_aux,
    model_epoch,
    pull_aux,
    pull_oldest,
    push_aux,
    push_iteration,
    push_summed,
    reply_aux,
    reply_kind,
    split_reply,
    sum_aux,
)

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("pserver", "learners", "scripts")
WIRE = ROOT / "pserver" / "comm" / "wire.py"
ENCODERS = {"pull_aux", "push_aux", "sum_aux", "reply_aux", "model_aux", "bye_aux",
            "retire_aux"}
DECODERS = {"pull_oldest", "push_iteration", "push_summed", "split_reply", "reply_kind",
            "model_epoch", "bye_consumed", "retired_learner"}  # fmt: skip


def through_header(kind: Tag, aux: int) -> int:
    """The aux word as the receiver unpacks it."""
    buf = Header(kind, 3, 7, 2, aux).pack(header_buffer()[0])
    h = Header.unpack(buf.copy())
    assert (h.kind, h.block, h.timestamp, h.sender) == (kind, 3, 7, 2)
    return h.aux


# -- every kind's helpers round-trip through a packed header ---------------------------------


@pytest.mark.parametrize("oldest", [-1, 0, 1, 41, 2**40])
def test_pull_round_trip(oldest):
    assert pull_oldest(through_header(Tag.PULL, pull_aux(oldest))) == oldest


@pytest.mark.parametrize("iteration", [None, 0, 1, 99, 2**40])
def test_learner_push_round_trip(iteration):
    aux = through_header(Tag.PUSH, push_aux(iteration))
    assert push_iteration(aux) == iteration
    assert push_summed(aux) == 0  # never read as an aggregator's sum


@pytest.mark.parametrize("n", [1, 2, 16, 1000])
def test_aggregator_push_round_trip(n):
    aux = through_header(Tag.PUSH, sum_aux(n))
    assert push_summed(aux) == n
    assert push_iteration(aux) is None  # the tree runs the block rule


@pytest.mark.parametrize("n", [0, -1])
def test_an_aggregator_sums_at_least_one_gradient(n):
    with pytest.raises(ValueError, match="at least one"):
        sum_aux(n)


@pytest.mark.parametrize("kind", list(Reply))
@pytest.mark.parametrize("version", [0, 1, 5, 255, 2**20])
def test_reply_round_trip(kind, version):
    aux = through_header(Tag.REPLY, reply_aux(kind, version))
    assert split_reply(aux) == (kind, version)
    assert reply_kind(aux) == kind
    assert Reply(reply_kind(aux)) is kind


def test_a_reply_with_a_version_is_not_its_kind_raw():
    """Why raw comparisons are refused: the word of a STOP with a version is not Reply.STOP."""
    aux = reply_aux(Reply.STOP, 3)
    assert aux != Reply.STOP and reply_kind(aux) == Reply.STOP


@pytest.mark.parametrize("epoch", [0, 1, 250])
def test_model_round_trip(epoch):
    assert model_epoch(through_header(Tag.MODEL, model_aux(epoch))) == epoch


@pytest.mark.parametrize("consumed", [0, 1, 4097])
def test_bye_round_trip(consumed):
    assert bye_consumed(through_header(Tag.BYE, bye_aux(consumed))) == consumed


@pytest.mark.parametrize("learner", [0, 5, 4097])
def test_retire_round_trip(learner):
    assert wire.retired_learner(through_header(Tag.RETIRE, wire.retire_aux(learner))) == learner


def test_the_helpers_named_here_are_wire_functions():
    for name in ENCODERS | DECODERS:
        assert callable(getattr(wire, name)), name


def test_the_stall_report_names_a_reply_kind():
    h = Header.unpack(Header(Tag.REPLY, 0, 4, 1, reply_aux(Reply.CURRENT, 2)).pack(
        np.zeros(wire.HEADER_WORDS, dtype=np.int64)))  # fmt: skip
    assert "aux=CURRENT@v2" in str(h)


# -- nobody outside wire.py reads or writes the word raw ---------------------------------------


def callee(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def raw_aux_uses(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: why`` for each raw read of ``.aux`` and each header built with a raw word."""
    tree = ast.parse(path.read_text(), str(path))
    decoded: set[int] = set()  # id() of the .aux nodes handed whole to a decoder
    out = []
    rel = path.relative_to(root)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = callee(node)
        if name in DECODERS and len(node.args) == 1 and not node.keywords:
            decoded.add(id(node.args[0]))
        if name == "Header":
            word = node.args[4] if len(node.args) >= 5 else next(
                (k.value for k in node.keywords if k.arg == "aux"), None)  # fmt: skip
            if word is not None and not (isinstance(word, ast.Call) and callee(word) in ENCODERS):
                out.append(f"{rel}:{node.lineno}: header built with a raw aux word "
                           f"({ast.unparse(word)}); use one of {sorted(ENCODERS)}")  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "aux" and id(node) not in decoded:
            out.append(f"{rel}:{node.lineno}: raw {ast.unparse(node)}; decode it with one of "
                       f"{sorted(DECODERS)}")  # fmt: skip
    return out


def test_the_scanner_sees_raw_uses(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text(
        "def f(h):\n"
        "    if h.aux == 3:\n"  # a comparison
        "        return h.aux[0]\n"  # an index
        "    x = reply_kind(h.aux)\n"  # fine
        "    Header(Tag.PULL, 0, 0, 0, 5)\n"  # a raw word
        "    Header(Tag.PULL, 0, 0, 0, aux=pull_aux(5))\n"  # fine
        "    return split_reply(h.aux + 1)\n"  # arithmetic before decoding
    )
    found = raw_aux_uses(bad, tmp_path)
    assert sorted(int(f.split(":")[1]) for f in found) == [2, 3, 5, 7], found


def test_no_raw_aux_outside_the_wire_module():
    files = [p for pkg in SCANNED for p in sorted((ROOT / pkg).rglob("*.py"))
             if p != WIRE and "__pycache__" not in p.parts]  # fmt: skip
    assert len(files) > 20
    found = [f for p in files for f in raw_aux_uses(p)]
    assert not found, "\n".join(found)

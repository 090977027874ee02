"""The header's aux word: one encoder and one decoder per message kind, and nobody else reads it.

``aux`` means something else for every kind (PULL: the oldest timestamp accepted; PUSH: a
learner's iteration tag or an aggregator's count of summed gradients; REPLY: the kind and a
window version; MODEL: the epoch). A raw ``h.aux == Reply.STOP`` silently breaks when the word
gains a field (a reply with a window version is not ``== Reply.STOP``), so the code base is read
with ``ast``: outside ``pserver/comm/wire.py`` the attribute ``.aux`` is only handed whole to one of
the decoders, and a header is only built with an encoder's word.

Fails on the main of issue 10: aggregator.py and overlap.py compare ``h.aux`` with ``Reply``.

Every MPI tag is wire.py's too (issue 21): outside it no module gives an MPI call an integer
literal or a module constant as its tag, nor defines an enum of tags. Fails on the main of issue
21, where ``pserver/roles/gossip.py`` defined ``CTRL, REPLY, MODEL = 41, 42, 43``.
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


@pytest.mark.parametrize("oldest", [0, 5, 2**40])
def test_a_push_pull_is_the_push_then_the_pull(oldest):
    h = wire.Header(Tag.PUSH_PULL, 3, 41, 7, wire.pull_aux(oldest))
    push, pull = wire.split_push_pull(h)
    assert push == wire.Header(Tag.PUSH, 3, 41, 7, wire.push_aux(None))
    assert wire.push_summed(push.aux) == 0 and wire.push_iteration(push.aux) is None
    assert pull == wire.Header(Tag.PULL, 3, 41, 7, wire.pull_aux(oldest))


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


# -- every tag is named in wire.py -------------------------------------------------------------

TAG_AT = {name: 2 for name in ("Send", "Isend", "Issend", "Ssend", "Bsend", "Rsend", "Ibsend",
                               "Irsend", "Send_init", "Recv", "Irecv", "Recv_init")}  # fmt: skip
TAG_AT.update({name: 1 for name in ("Probe", "Iprobe", "Mprobe", "Improbe")})


def module_ints(tree: ast.Module) -> set[str]:
    """Names bound to integer literals at module level (``A = 1``, ``A, B = 1, 2``)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                pairs = (zip(t.elts, node.value.elts, strict=True)
                         if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(t, node.value)])  # fmt: skip
                out |= {n.id for n, v in pairs if isinstance(n, ast.Name)
                        and isinstance(v, ast.Constant) and type(v.value) is int}  # fmt: skip
    return out


def tags_defined(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: why`` for each MPI tag this module defines itself: an integer literal or a
    module-level integer constant as a call's tag, or a class of tags."""
    tree = ast.parse(path.read_text(), str(path))
    consts, rel, out = module_ints(tree), path.relative_to(root), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.endswith(("Tag", "Tags")):
            out.append(f"{rel}:{node.lineno}: class {node.name}: tags belong in wire.py")
        if not isinstance(node, ast.Call):
            continue
        at = TAG_AT.get(callee(node))
        tag = node.args[at] if at is not None and len(node.args) > at else next(
            (k.value for k in node.keywords if k.arg == "tag"), None)  # fmt: skip
        literal = isinstance(tag, ast.Constant) and type(tag.value) is int
        if literal or (isinstance(tag, ast.Name) and tag.id in consts):
            out.append(f"{rel}:{node.lineno}: tag {ast.unparse(tag)} defined outside wire.py")
    return out


def test_the_tag_scanner_sees_tags_defined_here(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text(
        "A, B = 41, 42\n"
        "class MyTags:\n"  # a class of tags
        "    pass\n"
        "def f(comm, buf, b):\n"
        "    comm.Isend(buf, 1, A)\n"  # a module constant
        "    comm.Improbe(0, 7)\n"  # a literal
        "    comm.send(buf, dest=1, tag=B)\n"  # by keyword
        "    comm.Irecv(buf, 1, Tag.PULL)\n"  # fine: the wire's
        "    comm.Irecv(buf, 1, b.index)\n"  # fine: a payload's block
        "    comm.Recv(buf, 1, reply_tag(b))\n"  # fine
        "    records.send(buf, 3, 4)\n"  # fine: not an MPI call by keyword or position
    )
    found = tags_defined(bad, tmp_path)
    assert sorted(int(f.split(":")[1]) for f in found) == [2, 5, 6, 7], found


def test_no_tag_defined_outside_the_wire_module():
    files = [p for pkg in ("pserver", "learners") for p in sorted((ROOT / pkg).rglob("*.py"))
             if p != WIRE and "__pycache__" not in p.parts]  # fmt: skip
    assert len(files) > 20
    found = [f for p in files for f in tags_defined(p)]
    assert not found, "\n".join(found)


def test_the_gossip_tags_and_kinds_keep_their_wire_values():
    assert {t.name: int(t) for t in wire.GossipTag} == {"CTRL": 41, "REPLY": 42, "MODEL": 43}
    assert {k.name: int(k) for k in wire.GossipKind} == {"EXCHANGE": 1, "ANSWER": 2, "BYE": 3}
    # the learners' communicator carries only the gossip; still, no value is also a reply's tag
    assert all(int(t) not in set(Tag) and t < wire.REPLY_TAG_BASE for t in wire.GossipTag)

"""The plan and the runtime are frozen (issue 21 item 3): a driver receives them complete and
nothing assigns to them afterwards, the config included.

Two checks: the dataclasses refuse assignment (and the plan's config its keys), and no module of
the package assigns to a context, plan or runtime attribute (``ctx.X = ...``, ``self.ctx.X =
...``), which the frozen classes would refuse at run time only on the path that runs.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
from pathlib import Path

import pytest

from pserver.comm.waiting import PeerLog
from pserver.plan.config import is_sealed, load_config, revised, sealed
from pserver.runtime.context import Context, Plan, Runtime, prepare

ROOT = Path(__file__).resolve().parents[1]
HOLDERS = {"ctx", "context", "plan", "runtime"}  # the names a context or its halves go by


def a_plan(tmp_path: Path) -> Plan:
    over = ["data.source=synthetic", "data.n_samples=400", f"run.out_dir={tmp_path}/{{id}}"]
    plan, _ = prepare(load_config(None, over), 5, 3, logging.getLogger("test"), available=None,
                      rid="t")  # fmt: skip
    return plan


def test_the_plan_the_runtime_and_the_context_refuse_assignment(tmp_path: Path) -> None:
    plan = a_plan(tmp_path)
    runtime = Runtime(logging.getLogger("test"), None, None, PeerLog(), 0.0)  # type: ignore[arg-type]
    ctx = Context(plan, runtime)
    for holder, name, value in [
        (plan, "rank", 0),
        (plan, "w0", None),
        (plan, "cfg", plan.cfg),
        (runtime, "resume", None),
        (runtime, "t0", 1.0),
        (runtime, "log", runtime.log),
        (ctx, "plan", plan),
        (ctx, "runtime", runtime),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(holder, name, value)
    with pytest.raises(AttributeError):  # a property of the context, read through to the plan
        ctx.resume = None  # type: ignore[misc]
    assert ctx.cfg is plan.cfg and ctx.log is runtime.log and ctx.rank == 3


def test_the_plans_config_is_sealed_and_resolved_without_writing_back(tmp_path: Path) -> None:
    """``run.out_dir`` is expanded into the plan's copy; the caller's config is left as it was
    (it used to be written in place, as ``model.init_from`` was by the CLI)."""
    over = ["data.source=synthetic", "data.n_samples=400", f"run.out_dir={tmp_path}/{{id}}"]
    cfg = load_config(None, over)
    plan, _ = prepare(cfg, 5, 3, logging.getLogger("test"), available=None, rid="t")
    assert cfg.run.out_dir == f"{tmp_path}/{{id}}" and plan.cfg.run.out_dir == f"{tmp_path}/t"
    assert is_sealed(plan.cfg) and not is_sealed(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.cfg.model.init_from = "elsewhere"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.cfg.run = cfg.run  # type: ignore[misc]
    changed = revised(plan.cfg, "model", init_from="runs/a")
    assert changed.model.init_from == "runs/a" and plan.cfg.model.init_from == ""
    assert is_sealed(changed) and changed.run == plan.cfg.run
    copy = sealed(cfg)
    assert copy == cfg and is_sealed(copy) and not is_sealed(cfg)
    cfg.run.seed = 5  # the caller's own stays writable
    assert copy.run.seed == 0


def assigned_holders(tree: ast.AST) -> list[tuple[int, str]]:
    """``holder.X = ...`` (also augmented, annotated, ``self.holder.X = ...``, in a tuple) for
    a holder in ``HOLDERS``: (line, the target's text)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        flat = []
        for t in targets:
            flat.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
        for t in flat:
            if not isinstance(t, ast.Attribute):
                continue
            owner = t.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in HOLDERS:
                found.append((node.lineno, ast.unparse(t)))
    return found


def test_the_finder_finds_assignments() -> None:
    src = "ctx.resume = r\nself.ctx.t0 += 1\na, plan.w0 = 1, 2\nctx.peers.departures = d\n"
    assert [t for _, t in assigned_holders(ast.parse(src))] == [
        "ctx.resume", "self.ctx.t0", "plan.w0"
    ]  # fmt: skip


def test_nothing_assigns_to_a_context_plan_or_runtime() -> None:
    """Every driver gets the plan and the runtime complete (``pserver.job.cli.run``); a part's
    resume state is a new context (``Context.resumed``), never written into one."""
    hits = []
    for path in sorted((ROOT / "pserver").rglob("*.py")):
        for line, target in assigned_holders(ast.parse(path.read_text())):
            hits.append(f"{path.relative_to(ROOT)}:{line}: {target} = ...")
    assert hits == []

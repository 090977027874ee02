"""The layers of docs/architecture.md, read from the imports (``ast``, nothing is imported).

1. A **pure** module (listed in ``PURE``) imports neither ``mpi4py`` nor anything from
   ``pserver/comm/`` or ``pserver/roles/``, directly or through another project module: it is
   unit-tested in one process and must stay importable without MPI.
2. ``pserver/comm/`` (moving bytes) imports nothing from ``pserver/roles/`` (the loops above it).
3. No import cycle among the project's modules (``pserver``, ``learners``).

Every import statement counts, at module level or inside a function: a lazy import still runs
(and a cycle through one works only by the accident of call order), so it hides a dependency,
it does not remove it. Imports under ``if TYPE_CHECKING:`` are left out: they never run.
An import of ``a.b.c`` is an edge to the module ``a.b.c`` (or to ``a.b`` when ``c`` is a name
defined there), not to the parent packages it also runs: a package's ``__init__`` is a module
of its own, with its own edges (``pserver/protocols/__init__.py`` is pure and checked as one).

Fails on the main of issue 10: ``learners.models`` <-> ``learners.cnn``, ``learners.null``
(lazy imports in ``build_model``), removed by issue 11 item 7.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pserver", "learners")

# The layers of docs/architecture.md, read from the folders: a module's folder says its layer
# (the longest matching prefix wins; "pkg.sub/" names the package and everything under it). A
# module imports only modules of its own layer or below; layer 1 is pure (no mpi4py, directly
# or through another module), so it is unit-tested in one process and importable without MPI.
LAYERS: dict[str, int] = {
    "pserver.errors": 1,
    "pserver.plan/": 1,
    "pserver.protocols/": 1,
    "pserver.optim/": 1,
    "pserver.strategies/": 1,
    "pserver.dump/": 1,
    "pserver.ckpt/": 1,
    "learners/": 1,
    "pserver.comm/": 2,
    "pserver.runtime/": 3,
    "pserver.roles/": 4,
    "pserver.ckpt.drivers/": 4,
    "pserver.sim/": 4,  # pserver-sim: protocols on a simulated clock, no mpi4py
    "pserver.job/": 5,
    "pserver.stats/": 5,
    "pserver": 1,  # the package itself: its version only
}
NAMES = {1: "pure", 2: "transport", 3: "runtime", 4: "drivers", 5: "entry points"}
PURE = tuple(p for p, n in LAYERS.items() if n == 1)
IMPURE = ("mpi4py", "pserver.comm", "pserver.roles")

# Violations on main that another item of issue 11 removes; this list may only shrink (a
# listed violation that no longer exists fails too, so it is struck off when it goes).
KNOWN: dict[tuple[str, str], str] = {}


def layer(name: str) -> int:
    """The layer of a project module: its longest matching folder prefix in ``LAYERS``."""
    best, n = -1, 0
    for p, lay in LAYERS.items():
        bare = p.rstrip("/")
        if name == bare or (p.endswith("/") and name.startswith(bare + ".")):
            if len(bare) > best:
                best, n = len(bare), lay
    return n


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``name`` imports: project modules by name, and any ``mpi4py`` import."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]  # fmt: skip
        for t in targets:
            if t.split(".")[0] == "mpi4py":
                out.add("mpi4py")
            elif t in modules:
                out.add(t)
            elif t.split(".")[0] in PACKAGES:  # a name inside a module: the module
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t:
                    out.add(t)
    out.discard(name)
    return out


@functools.cache
def graph() -> dict[str, set[str]]:
    """Every project module -> the modules it imports (read once per test session)."""
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def in_prefix(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``prefixes`` ("pkg.sub/": the package and its modules)."""
    return any(
        name == p.rstrip("/") or name.startswith(p.rstrip("/") + ".") if p.endswith("/")
        else name == p
        for p in prefixes
    )  # fmt: skip


def impure_path(start: str, deps: dict[str, set[str]]) -> list[str] | None:
    """The shortest import chain from ``start`` to mpi4py, comm/ or roles/ (None: none)."""
    seen, frontier = {start: [start]}, [start]
    while frontier:
        nxt = []
        for m in frontier:
            for d in sorted(deps.get(m, ())):
                if d in seen:
                    continue
                seen[d] = [*seen[m], d]
                if d == "mpi4py" or in_prefix(d, ("pserver.comm/", "pserver.roles/")):
                    return seen[d]
                nxt.append(d)
        frontier = nxt
    return None


def cycles(deps: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(deps.get(v, ())):
            if w not in deps:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def test_the_reader_sees_lazy_and_relative_imports():
    deps = graph()
    assert "pserver.comm.waiting" in deps["pserver.job.cli"]  # module level
    assert "mpi4py" in deps["pserver.job.cli"]  # inside main()
    assert "pserver.roles.server" in deps["pserver.job.cli"]  # inside run()
    assert "pserver.protocols.base" in deps["pserver.protocols"]
    assert all(layer(m) == 1 for m in ("learners.cnn", "pserver.protocols.ssp"))


def test_pure_modules_import_no_mpi_no_comm_no_roles():
    deps = graph()
    pure = sorted(m for m in deps if layer(m) == 1)
    assert "pserver.plan.config" in pure and "learners.models" in pure
    found = {}
    for m in pure:
        chain = impure_path(m, deps)
        if chain is not None:
            found[(m, chain[-1])] = " -> ".join(chain)
    unexpected = {k: v for k, v in found.items() if k not in KNOWN}
    assert not unexpected, "pure modules reaching MPI/comm/roles:\n" + "\n".join(
        unexpected.values()
    )
    gone = set(KNOWN) - set(found)
    assert not gone, f"fixed, strike off KNOWN: {sorted(gone)}"


def test_comm_does_not_import_roles():
    deps = graph()
    bad = [
        f"{m} -> {d}"
        for m, ds in sorted(deps.items())
        if in_prefix(m, ("pserver.comm/",))
        for d in sorted(ds)
        if in_prefix(d, ("pserver.roles/",))
    ]
    assert not bad, bad


def test_every_module_has_a_layer_and_imports_only_downwards():
    deps = graph()
    assert not [m for m in deps if layer(m) == 0]
    bad = [
        f"{m} (layer {layer(m)}) -> {d} (layer {layer(d)})"
        for m, ds in sorted(deps.items())
        for d in sorted(ds)
        if d != "mpi4py" and layer(d) > layer(m)
    ]
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_the_root_holds_at_most_ten_modules_and_no_checkpoint_module_lives_outside_ckpt():
    root = [p for p in (ROOT / "pserver").glob("*.py")]
    assert len(root) <= 10, sorted(p.name for p in root)
    stray = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "pserver").rglob("*.py")
        if ("ckpt" in p.stem) and "ckpt" not in p.relative_to(ROOT / "pserver").parts[:-1]
    ]
    assert not stray, stray


def test_learners_import_no_roles_comm_cli_or_runtime():
    deps = graph()
    bad = [
        f"{m} -> {d}"
        for m, ds in sorted(deps.items())
        if m.startswith("learners")
        for d in sorted(ds)
        if d == "mpi4py" or layer(d) > 1
    ]
    assert not bad, bad


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_cycle_finder_finds_a_lazy_cycle():
    deps = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(deps) == [["a", "b", "c"]]
    assert impure_path("d", {"d": {"x"}, "x": {"pserver.comm.shm"}}) == [
        "d",
        "x",
        "pserver.comm.shm",
    ]


def layers_table() -> dict[str, tuple[int, set[str]]]:
    """docs/architecture.md's *Layers* table: folder -> (layer, the modules it names)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0][:1].isdigit():
            continue
        folder = cells[1].strip("`")
        rows[folder] = (int(cells[0].split(".")[0]), {m.strip(" `") for m in cells[2].split(",")})
    return rows


def test_the_layers_table_names_every_module_in_its_folders_layer():
    rows = layers_table()
    tree: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            folder = path.parent.relative_to(ROOT).as_posix() + "/"
            tree.setdefault(folder, set())
            if path.stem != "__init__":
                tree[folder].add(path.stem)
    assert set(rows) == set(tree), (sorted(set(tree) - set(rows)), sorted(set(rows) - set(tree)))
    for folder, (lay, named) in sorted(rows.items()):
        missing, extra = sorted(tree[folder] - named), sorted(named - tree[folder])
        assert not missing and not extra, f"{folder}: not in the table {missing}, gone {extra}"
        assert lay == layer(folder.rstrip("/").replace("/", ".")), folder

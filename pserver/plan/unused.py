"""Keys that the chosen strategy, data source or model kind does not use (pure).

A key typed on the command line (``Config.overridden``) that the run would ignore is refused
with one line naming what it belongs to, e.g.
``protocol.c = 2 belongs to psp; protocol.name = "hardsync" does not use it``: whoever typed it
meant it to take effect. A key of the config file that the run ignores is not an error, since one
file may serve a comparison of several strategies (``protocol.n`` for softsync beside
``protocol.c`` for psp): rank 0 lists those keys once, at INFO level, at start.
``docs/config.md`` (*Keys the run does not use*) lists the rule of every key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pserver import strategies
from pserver.strategies.prediction import PP_ASGD

#: data.* keys -> the data.source values that read them
SOURCE_KEYS = {
    "path": ("hdf5",), "test_path": ("hdf5",), "dir": ("fashion-mnist",),
    "n_samples": ("synthetic",), "n_features": ("synthetic",), "n_classes": ("synthetic",),
}
#: model.* keys -> the model.kind values that read them
KIND_KEYS = {
    "hidden": ("mlp",), "size_mib": ("null",), "channels": ("cnn",), "module": ("torch", "python"),
}


@dataclass(frozen=True)
class Rule:
    """``key`` is used when ``used(cfg)``; otherwise it ``belongs`` to something else and
    ``chooser(cfg)`` names the setting that leaves it unused."""

    key: str
    belongs: str
    used: Callable[[Any], bool]
    chooser: Callable[[Any], str]
    label: str = ""  # ``belongs`` in fewer words, for the start-up list ("" : belongs itself)

    def message(self, cfg: Any) -> str:
        section, name = self.key.split(".")
        value = json.dumps(getattr(getattr(cfg, section), name))
        return (f"{self.key} = {value} belongs to {self.belongs}; "
                f"{self.chooser(cfg)} does not use it")

    def short(self, cfg: Any) -> str:
        """``protocol.c = 2 (psp)``: the key, its value and its owner, for the start-up list."""
        section, name = self.key.split(".")
        value = json.dumps(getattr(getattr(cfg, section), name))
        return f"{self.key} = {value} ({self.label or self.belongs})"


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
    family = {f: {s.name for s in strategies.REGISTRY.values() if s.family == f}
              for f in strategies.FAMILIES}  # fmt: skip
    for key in strategies.params():
        owners = strategies.owners(key)
        if len(owners) < len(strategies.REGISTRY):
            whole = [f for f, names in family.items() if names and names == set(owners)]
            label = f"the {whole[0].replace(' ', '-')} strategies" if whole else ""
            rules.append(Rule(
                f"protocol.{key}", " and ".join(owners),
                lambda cfg, owners=owners: cfg.protocol.name in owners,
                setting("protocol.name"), label,
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
        Rule("cluster.bcast_tree", "a learner broadcast tree (cluster.bcast_fanout >= 2)",
             lambda cfg: cfg.cluster.bcast_fanout > 0, setting("cluster.bcast_fanout")),
        Rule("optim.warmup_start", "a warm-up (optim.warmup_epochs > 0)",
             lambda cfg: cfg.optim.warmup_epochs > 0, setting("optim.warmup_epochs")),
        Rule("optim.lr_decay_from", "annealing (optim.lr_decay < 1)",
             lambda cfg: cfg.optim.lr_decay != 1.0, setting("optim.lr_decay")),
        # PP-ASGD's keys beside its switch, from its registry descriptor
        *(Rule(f"protocol.{p.key}", f"protocol.{PP_ASGD.switch} = true (PP-ASGD)",
               PP_ASGD.on, setting(f"protocol.{PP_ASGD.switch}"))
          for p in PP_ASGD.params[1:]),
        choice_rule("data.test_fraction", "data.source", ("digits", "synthetic", "hdf5")),
    ]


def unused(cfg: Any) -> tuple[list[str], list[str]]:
    """(refusals, unread): one refusal line per key typed on the command line that this config
    does not use, and one short entry (``key = value (owner)``) per such key of the file."""
    refused: list[str] = []
    unread: dict[str, str] = {}  # key -> entry: a key of two rules (predict_steps) listed once
    for rule in rules():
        if rule.key not in cfg.given or rule.used(cfg):
            continue
        if rule.key in cfg.overridden:
            refused.append(rule.message(cfg))
        else:
            unread.setdefault(rule.key, rule.short(cfg))
    for key, value in getattr(cfg, "set_aside", {}).items():  # reset: the file's value is said
        unread.setdefault(key, f"{key} = {json.dumps(value)} (the strategies with shards)")
    return refused, list(unread.values())


def unread_line(entries: list[str]) -> str:
    """The one INFO line rank 0 logs at start for the file's keys this run does not read."""
    return ("keys of the config file this run does not read (they serve other strategies, "
            "sources or models): " + ", ".join(entries))

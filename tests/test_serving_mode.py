"""PP-ASGD as the registry's PREDICTION family (a layer over the parameter-server strategies) and
the shard's serving mode decided once from it (``pserver.strategies.serving``), one process."""

from __future__ import annotations

import numpy as np
import pytest

from pserver.plan.config import load_config
from pserver.protocols.shard_block import ShardBlock
from pserver.strategies import REGISTRY, lookup
from pserver.strategies.base import FAMILIES, PARAMETER_SERVER, PREDICTION
from pserver.strategies.prediction import PP_ASGD, PREDICT
from pserver.strategies.serving import serving

MOMENTUM = ["optim.rule=momentum", "optim.momentum=0.9"]


def test_pp_asgd_is_the_prediction_family_and_every_ps_strategy_declares_it():
    assert PP_ASGD.family == PREDICTION and PREDICTION in FAMILIES
    assert PP_ASGD.switch == "predict" and PP_ASGD.params == PREDICT and PP_ASGD.serves
    for name, s in REGISTRY.items():
        declared = s.family == PARAMETER_SERVER
        assert (s.layers == (PP_ASGD,)) is declared, name
        assert s.uses("predict_steps") is declared and s.uses("predict_probe") is declared


@pytest.mark.parametrize("name", ["async", "softsync", "ssp", "psp"])
def test_predict_true_serves_predictions_and_staging_moves_them_to_the_staged_copy(name):
    cfg = load_config(None, [f"protocol.name={name}", "protocol.predict=true", *MOMENTUM])
    assert lookup(name).layers_on(cfg) == (PP_ASGD,)
    mode = serving(cfg)
    assert mode.name == "predicted" and mode.predicts and mode.produced and mode.block == ""
    assert not mode.sends_read_w  # an update writes w in place: no send reads it
    staged = serving(cfg, staged=True)
    assert staged.predicts and not staged.produced  # written into the staged host copy
    assert not staged.sends_read_w


@pytest.mark.parametrize("name", ["async", "hardsync", "bmuf", "ma", "sync", "adpsgd"])
def test_without_predict_the_mode_is_plain_or_the_strategys_block(name):
    cfg = load_config(None, [f"protocol.name={name}"])
    mode = serving(cfg)
    assert not mode.predicts and not mode.produced and mode.predict is None
    assert mode.name == (lookup(name).shard_block or "plain")
    assert mode.name in ("plain", "block-momentum")
    assert mode.sends_read_w and not serving(cfg, staged=True).sends_read_w  # copy-on-write


def test_the_block_predicts_as_its_mode_says():
    cfg = load_config(None, ["protocol.name=async", "protocol.predict=true", *MOMENTUM])
    w = np.zeros(4)
    assert ShardBlock.build(w.copy(), cfg, 2, 100, np).predictor is not None  # cfg's mode
    plain = serving(load_config(None, ["protocol.name=async", *MOMENTUM]))
    assert ShardBlock.build(w.copy(), cfg, 2, 100, np, plain).predictor is None

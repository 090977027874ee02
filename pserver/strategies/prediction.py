"""PP-ASGD (Sato et al. 2017), the PREDICTION family: a layer over the parameter-server strategies.

Selected by ``protocol.predict = true`` beside ``protocol.name``: any PS strategy whose gradients
can be stale (async, softsync, SSP, PSP) may serve predicted weights f_S(w, M) (eq. (2)) instead
of w (``pserver.optim.prediction``, produced in the shard block's ``serve`` hook). Its
descriptor, :data:`PP_ASGD`, holds its family, keys and checks; every PS strategy declares it
(``Strategy.layers``), and the shard asks ``pserver.strategies.serving`` whether it is on.
"""

from __future__ import annotations

from pserver.errors import ConfigError
from pserver.optim.prediction import RULES
from pserver.strategies.base import PREDICTION, Config, Layer, Param, Strategy

#: The keys, the switch first (``pserver.plan.config.ProtocolConfig`` has the same fields).
PREDICT = (
    Param("predict", bool, False, help="serve predicted weights f_S(w, M) (PP-ASGD)"),
    Param("predict_steps", int, -1, help="S of f_S; -1: ⌊measured mean staleness⌋"),
    Param("predict_probe", int, 50, ">= 0", help="updates between prediction-error probes"),
)

#: strategies whose learners always compute on the latest weights: nothing to predict
NO_STALENESS = ("hardsync",)


def check_predict(s: Strategy, cfg: Config) -> None:
    """Refuse PP-ASGD where eq. (2) means nothing: hardsync (σ = 0 by construction), an update
    rule without a momentum term M, μ = 0, S < −1; and its keys typed on the command line
    without ``predict`` (the file's are listed as unread: ``pserver.plan.unused``)."""
    p, o = cfg.protocol, cfg.optim
    if not p.predict:
        for key in ("predict_steps", "predict_probe"):
            if f"protocol.{key}" in cfg.overridden:
                raise ConfigError(
                    f"protocol.{key} = {getattr(p, key)} belongs to protocol.predict = true "
                    "(PP-ASGD); protocol.predict = false does not use it"
                )
        return
    if s.name in NO_STALENESS:
        raise ConfigError(
            f"protocol.predict = true: PP-ASGD predicts the weights a stale gradient will meet, "
            f"and under {s.name} every gradient is computed on the current weights; use "
            "protocol.name = async, softsync, ssp or psp"
        )
    if o.rule not in RULES:
        raise ConfigError(
            f"protocol.predict = true extrapolates the server's momentum term, which "
            f"optim.rule = {o.rule!r} has none; use optim.rule = {' or '.join(RULES)}"
        )
    if o.momentum <= 0.0:
        raise ConfigError(
            "protocol.predict = true with optim.momentum = 0: the momentum term is 0 and "
            "f_S(w, M) = w; set optim.momentum in (0, 1)"
        )
    if p.predict_steps < -1:
        raise ConfigError(
            f"protocol.predict_steps = {p.predict_steps}: expected S >= 0, or -1 to take S "
            "from the measured staleness"
        )


#: The descriptor of the PREDICTION family's one strategy.
PP_ASGD = Layer(
    name="pp-asgd",
    family=PREDICTION,
    summary="PP-ASGD: pulls get the predicted weights f_S(w, M) (Sato et al. 2017, eq. (2))",
    params=PREDICT,
    checks=(check_predict,),
    serves=True,
)

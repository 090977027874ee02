"""A shard's serving mode, decided once from the registry: what its blocks compute and serve.

Three modes (``Serving.name``): **plain** (``ShardBlock``: pulls read the weights w of the last
update), **predicted** (PP-ASGD's layer is on, Sato et al. 2017 eq. (2): pulls read f_S(w, M)),
and **block-momentum** (BMUF's master, Chen & Huo eqs. (2)-(6): the strategy's
``shard_block``). Whether sends read staged host copies (GPU weights without CUDA-aware MPI, no
shared window) is the transport's fact, passed in: it decides where a prediction is written
(:attr:`Serving.produced`). Pure: the server driver (``pserver.roles.server``), its block builder
(``pserver.roles.shard_state``), the block's arithmetic (``ShardBlock.build``) and the checkpoint
checks read this one object instead of testing ``protocol.predict`` themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from pserver.strategies import lookup
from pserver.strategies.base import Config, Layer


@dataclass(frozen=True)
class Serving:
    """How one shard serves its blocks (see the module docstring)."""

    block: str  # ``Strategy.shard_block``: "" the plain ShardBlock, or BMUF's
    predict: Layer | None  # the layer whose model pulls get instead of w (PP-ASGD), or None
    staged: bool = False  # weight sends read staged host copies (versioned), not w itself

    @property
    def name(self) -> str:
        if self.block:
            return self.block
        return "predicted" if self.predict is not None else "plain"

    @property
    def predicts(self) -> bool:
        """The block's arithmetic serves f_S(w, M) (``ShardBlock.predicting``)."""
        return self.predict is not None

    @property
    def produced(self) -> bool:
        """The versions hold the predictions, each produced once per update at its first pull,
        and w is private to the arithmetic. Staged: the prediction is written into the staged
        host copy instead, and the versions are those copies."""
        return self.predict is not None and not self.staged

    @property
    def sends_read_w(self) -> bool:
        """Weight sends read w itself (no staging, no prediction): an update must then write a
        new version instead of w in place (copy-on-write, ``pserver.protocols.versions``)."""
        return not (self.staged or self.produced)


def serving(cfg: Config, staged: bool = False) -> Serving:
    """The serving mode of ``cfg``'s strategy with its layers, and the transport's staging."""
    s = lookup(cfg.protocol.name)
    served = [layer for layer in s.layers_on(cfg) if layer.serves]
    return Serving(s.shard_block, served[0] if served else None, staged)

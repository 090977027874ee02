"""An aggregator's arithmetic in Rudra-adv's parameter-server tree (Gupta et al. §III-C, Fig. 2).

An aggregator sums one gradient per live child for each block and relays the sum upwards
(``pserver.roles.aggregator`` moves the bytes and keeps the round's bookkeeping). The sum lives in
two buffers per block: ``total``, the round's sum, and ``recv``, where the next child's gradient
lands. Pure: no MPI; ``xp`` is numpy or CuPy.
"""

from __future__ import annotations

from typing import Any


def add_gradient(xp: Any, total: Any, recv: Any, first: bool) -> tuple[Any, Any]:
    """Add the gradient just received (in ``recv``) into the round's sum; returns the new
    ``(total, recv)`` pair.

    The first gradient of a round (``first``) becomes the sum by swapping the two buffers, not by
    zeroing and adding: it is the gradient itself bit for bit, and costs nothing. Later ones are
    added in place, in arrival order. The caller must not swap while the previous round's sum is
    still being sent from ``total`` (the aggregator drains that send first).
    """
    if first:
        return recv, total
    xp.add(total, recv, out=total)
    return total, recv

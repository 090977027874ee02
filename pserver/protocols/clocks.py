"""Scalar timestamps, vector clocks and staleness (Rudra §III-A, definitions and eq. 2).

A server block's weights carry a scalar timestamp ``ts`` that starts at 0 and grows by one per
update. A gradient carries the timestamp of the weights it was computed from. The timestamps of
the gradients that advance the weights from ``ts_{i-1}`` to ``ts_i`` form the update's vector
clock ``<ts_i1, ..., ts_in>``.
"""

from __future__ import annotations

from collections.abc import Sequence


def staleness(server_ts: int, gradient_ts: int) -> int:
    """σ of one gradient applied to weights at ``server_ts``: the updates it missed."""
    if gradient_ts > server_ts:
        raise ValueError(f"gradient timestamp {gradient_ts} is ahead of the server's {server_ts}")
    return server_ts - gradient_ts


def mean_staleness(new_ts: int, vector_clock: Sequence[int]) -> float:
    """Eq. (2): ⟨σ⟩ = (i − 1) − mean(i_1, …, i_n) for the update that produces ``ts_i``."""
    if not vector_clock:
        raise ValueError("an update needs at least one gradient")
    return (new_ts - 1) - sum(vector_clock) / len(vector_clock)

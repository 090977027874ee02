"""The pure arithmetic of the aggregator and of ADPSGD's average model (issue 21: moved out of
the drivers), on one process: ``protocols.tree.add_gradient`` and ``protocols.ring.sum_to_mean``."""

from __future__ import annotations

import numpy as np

from pserver.protocols.ring import sum_to_mean
from pserver.protocols.tree import add_gradient


def test_a_round_sums_its_gradients_in_arrival_order_and_the_first_is_swapped_in():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(7).astype(np.float32) for _ in range(3)]
    total, recv = np.full(7, np.nan, np.float32), np.empty(7, np.float32)  # total: stale garbage
    a, b = total, recv
    for k, g in enumerate(grads):
        recv[:] = g  # the child's gradient lands in recv
        total, recv = add_gradient(np, total, recv, first=k == 0)
        if k == 0:  # swapped, not zero + add: the gradient bit for bit, no NaN carried over
            assert total is b and recv is a and np.array_equal(total, g)
        else:
            assert total is not recv
    want = (grads[0] + grads[1]) + grads[2]
    assert np.array_equal(total, want)
    assert {id(total), id(recv)} == {id(a), id(b)}  # still the two buffers, never a new one


def test_a_second_round_starts_over_from_its_first_gradient():
    total, recv = np.array([5.0, 5.0]), np.array([1.0, 2.0])
    total, recv = add_gradient(np, total, recv, first=False)
    assert total.tolist() == [6.0, 7.0]
    recv[:] = [10.0, 20.0]
    total, recv = add_gradient(np, total, recv, first=True)  # the last sum is not carried
    assert total.tolist() == [10.0, 20.0] and recv.tolist() == [6.0, 7.0]


def test_the_summed_models_become_their_mean_as_before():
    models = [np.array([1.0, 2.0, 4.0], np.float32) * k for k in (1, 2, 3)]
    total = models[0] + models[1] + models[2]
    before = total * np.float32(1.0 / 3)  # what the driver did: multiply by 1/λ
    sum_to_mean(np, total, 3)
    assert total.dtype == np.float32 and np.array_equal(total, before)
    assert np.allclose(total, np.mean(models, axis=0))

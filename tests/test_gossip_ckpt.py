"""ADPSGD's checkpoint in one process: a learner's state through a file and back (its own
steps across the cut equal the serial reference bit for bit: λ = 1 arithmetic, since ADPSGD
itself refuses one learner), the epoch averages' cut, the data quota's count, the refusals."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from pserver.ckpt.drivers.gossip import exchange_state, restore_exchange
from pserver.ckpt.files import CheckpointError, State, read_state, write_state
from pserver.ckpt.records.gossip import agreed_cut, check_learner, minibatches_to, owed
from pserver.ckpt.records.quota import quota_state, restore_quota
from pserver.optim.local_update import LocalUpdate
from pserver.plan.config import load_config
from pserver.protocols.epochs import EpochCounter
from pserver.protocols.lockstep import FREE, DataQuota
from pserver.protocols.ring import VectorClock, local_epoch


def fake_exchange(cfg, w: np.ndarray, n_learners: int = 1, me: int = 0, train_size: int = 1):
    """What exchange_state/restore_exchange read of a GossipExchange, without MPI."""
    gossip = SimpleNamespace(w=w, clock=VectorClock(n_learners, me), k=0, exchanged=0,
                             lock=threading.Lock())  # fmt: skip
    backend = SimpleNamespace(to_host=np.array, copy_from_host=lambda h, o: np.copyto(o, h))
    average = SimpleNamespace(counter=EpochCounter.from_config(cfg, train_size), resumed=None)
    ex = SimpleNamespace(gossip=gossip, backend=backend, average=average, have={},
                         rule=LocalUpdate(cfg.optim, w.size, np, w.dtype))  # fmt: skip
    average.resumed = lambda e: setattr(average.counter, "next_epoch", e)
    return ex


def test_one_learners_steps_across_a_checkpoint_are_the_serial_reference_bit_for_bit(tmp_path):
    """The quickstart's momentum, weight decay and milestones; cut mid-epoch 2 (velocity,
    clock and epoch count through an HDF5 file): the weights of ``train_serial``."""
    from learners.data import BatchSampler, load_dataset
    from learners.models import build_model
    from learners.serial import train_serial

    cfg = load_config(None, ["optim.rule=momentum", "optim.weight_decay=1e-4",
                             "optim.lr_milestones=[1, 2]", "model.kind=mlp", "model.hidden=[8]",
                             "data.batch_size=64", "run.epochs=3"])  # fmt: skip
    data = load_dataset(cfg.data, cfg.run.seed)
    n = len(data.y_train)
    total = 3 * n // 64
    want = train_serial(cfg, data, total)
    model = build_model(cfg.model, data.n_features, data.n_classes, np)
    sampler = BatchSampler(n, 64, cfg.run.seed)

    def run(ex, steps: int) -> None:
        g = np.empty_like(ex.gossip.w)
        for _ in range(steps):
            idx = sampler.next()
            model.loss_grad(ex.gossip.w, data.X_train[idx], data.y_train[idx], g)
            step = ex.gossip.clock.own
            ex.rule.step(ex.gossip.w, g, local_epoch(step, 1, 64, n))
            ex.gossip.clock.tick()

    first = fake_exchange(cfg, model.init_params(cfg.run.seed), train_size=n)
    cut = total // 2 + 5
    run(first, cut)
    first.gossip.k, first.average.counter.next_epoch = 7, 2
    saved = exchange_state(first)
    assert set(saved.arrays) == {"w", "opt.velocity"}
    write_state(tmp_path / "l.h5", saved.arrays, saved.attrs)
    back = read_state(tmp_path / "l.h5")
    second = fake_exchange(cfg, model.init_params(cfg.run.seed), train_size=n)
    restore_exchange(second, back)
    assert second.gossip.clock.own == cut and second.gossip.k == 7 and second.have == {0: cut}
    assert second.average.counter.next_epoch == 2
    assert np.array_equal(second.gossip.w, first.gossip.w)
    run(second, total - cut)
    assert np.array_equal(second.gossip.w, want)


def test_the_cut_of_the_epoch_averages():
    assert owed(next_epoch=4, last_epoch=20) == 3  # averages of epochs 1-3 joined or queued
    assert owed(next_epoch=21, last_epoch=20) == 19  # the last one is the final average
    assert agreed_cut((1, 7)) == (True, 7) and agreed_cut((0, 19)) == (False, 19)
    counter = EpochCounter(train_size=1347, batch_size=16, epochs=20)
    ends = counter.advance(minibatches_to(5, 1347, 16))
    assert ends.ended == (1, 2, 3, 4, 5) and counter.next_epoch == 6  # exactly up to the cut


def test_the_quota_keeps_what_the_learners_computed_on():
    """Learner ranks 3 and 4 (indices 0, 1) were served 10 and 7 this run after 5 and 6
    before; rank 3 computed on 8 of its 10 (2 prefetched go back to the stream)."""
    quota = DataQuota(FREE, total=40, n_learners=2, served={0: 15, 1: 13})
    attrs = quota_state(quota, {3: 10, 4: 7}, {3: 8, 4: 7}, lambda r: r - 3)
    assert attrs == {"kind": FREE, "computed": {"0": 13, "1": 13}}
    resumed = DataQuota(FREE, total=40, n_learners=2)
    restore_quota(resumed, attrs)
    assert resumed.count == 26
    served = sum(resumed.allows(i % 2) for i in range(100))
    assert served == 40 - 26  # the replayed 2 among them: M over all parts


def test_a_learner_state_that_does_not_fit_is_refused():
    w = np.zeros(5, np.float32)
    good = State(
        {"exchange.w": w, "exchange.opt.velocity": w},
        {"exchange": {"clock": [3, 1], "k": 3, "exchanged": 3, "next_epoch": 2}},
    )
    check_learner(good, 5, np.float32, ["velocity"], 2, "here")
    with pytest.raises(CheckpointError, match="'exchange.w' is float32\\[5\\].*float32\\[6\\]"):
        check_learner(good, 6, np.float32, ["velocity"], 2, "here")
    with pytest.raises(CheckpointError, match="lacks 'exchange.opt.sum_sq'"):
        check_learner(good, 5, np.float32, ["sum_sq"], 2, "here")
    with pytest.raises(CheckpointError, match="vector clock has 2 learners, this run has 4"):
        check_learner(good, 5, np.float32, ["velocity"], 4, "here")
    with pytest.raises(CheckpointError, match="lacks this ADPSGD learner's clock"):
        check_learner(State(good.arrays, {"exchange": {}}), 5, np.float32, [], 2, "here")


def test_adpsgd_and_prediction_are_supported_also_with_a_tree():
    from pserver.ckpt.resume import unsupported
    from pserver.plan.config import Config

    cfg = Config()
    cfg.protocol.name, cfg.cluster.servers = "adpsgd", 0
    assert unsupported(cfg) is None
    cfg = Config()
    cfg.protocol.name, cfg.protocol.predict = "async", True
    assert unsupported(cfg) is None
    cfg.cluster.tree_fanout = 2  # refused before the tree's cut was drained (aggregator_ckpt)
    assert unsupported(cfg) is None

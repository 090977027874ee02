"""Serial SGD on one process: the reference a parallel run with λ = 1 must reproduce.

Same seed, same initial weights, same minibatch stream (one ``BatchSampler``), same update rule
and learning rate as the parameter server applies with a single learner: the schedule
(``scheduled_lr``: warm-up, step decay, annealing) at the fractional epoch of the samples before
each step, ``step · μ / N``, as a shard counts its applied gradients.
"""

from __future__ import annotations

import math

import numpy as np

from learners.data import BatchSampler, Dataset
from learners.models import build_model
from pserver.optim.rules import make_updater, scheduled_lr
from pserver.plan.config import Config


def serial_steps(cfg: Config, n_train: int) -> int:
    """Minibatches a run of ``cfg.run.epochs`` epochs applies (the server stops at that count)."""
    return math.ceil(cfg.run.epochs * n_train / cfg.data.batch_size)


def train_serial(
    cfg: Config, dataset: Dataset, steps: int | None = None, w0: np.ndarray | None = None
) -> np.ndarray:
    """Run plain minibatch SGD and return the final flat weight vector (from ``w0``, a copy of
    which is trained, or from ``init_params(run.seed)``)."""
    model = build_model(cfg.model, dataset.n_features, dataset.n_classes, np)
    w = model.init_params(cfg.run.seed) if w0 is None else np.array(w0, dtype=model.dtype)
    grad = np.empty_like(w)
    sampler = BatchSampler(len(dataset.y_train), cfg.data.batch_size, cfg.run.seed)
    updater = make_updater(cfg.optim, model.n_params, np, w.dtype)
    n_train, batch = len(dataset.y_train), cfg.data.batch_size
    for step in range(serial_steps(cfg, n_train) if steps is None else steps):
        idx = sampler.next()
        model.loss_grad(w, dataset.X_train[idx], dataset.y_train[idx], grad)
        updater.step(w, grad, scheduled_lr(cfg.optim, step * batch / n_train))
    return w


def train_serial_predicted(
    cfg: Config, dataset: Dataset, predict_steps: int = 0, steps: int | None = None
) -> np.ndarray:
    """Momentum SGD whose gradients are computed on PP-ASGD's prediction (Sato et al. eq. (2))
    f_S(w, M) = w + M·Σ_{s=1}^{S+1} μ^s of the current weights, S = ``predict_steps``: what
    a server with ``protocol.predict`` and one blocking learner (σ = 0, so S = 0 measured)
    computes. The update path is plain ``optim.rule`` momentum; only the point the gradient is
    taken at moves (S = 0: Nesterov's look-ahead w + μM, the paper's Algorithm 4, line 15).
    Returns w, never the prediction."""
    from pserver.optim.prediction import Predictor

    model = build_model(cfg.model, dataset.n_features, dataset.n_classes, np)
    w = model.init_params(cfg.run.seed)
    grad, served = np.empty_like(w), np.empty_like(w)
    sampler = BatchSampler(len(dataset.y_train), cfg.data.batch_size, cfg.run.seed)
    updater = make_updater(cfg.optim, model.n_params, np, w.dtype)
    velocity = updater.state_arrays()["velocity"]
    predictor = Predictor(cfg.optim.rule, cfg.optim.momentum, predict_steps, 0, w.size)
    n_train, batch = len(dataset.y_train), cfg.data.batch_size
    for step in range(serial_steps(cfg, n_train) if steps is None else steps):
        idx = sampler.next()
        model.loss_grad(predictor.serve(w, velocity, served), dataset.X_train[idx],
                        dataset.y_train[idx], grad)  # fmt: skip
        lr = scheduled_lr(cfg.optim, step * batch / n_train)
        updater.step(w, grad, lr)
        predictor.after_update(step + 1, 0.0, lr, w, velocity)
    return w


def train_serial_delayed(cfg: Config, dataset: Dataset, steps: int | None = None) -> np.ndarray:
    """HYBRID's serial reference (IBM §3): the same SGD, each gradient applied one step late.

    Step k computes g_k on the weights with g_0 … g_{k-2} applied, then applies g_{k-1}; the
    last gradient is applied after the last step, so every gradient is applied, each at the
    learning rate of the epoch of the step that computed it.
    """
    model = build_model(cfg.model, dataset.n_features, dataset.n_classes, np)
    w = model.init_params(cfg.run.seed)
    grads = (np.empty_like(w), np.empty_like(w))
    sampler = BatchSampler(len(dataset.y_train), cfg.data.batch_size, cfg.run.seed)
    updater = make_updater(cfg.optim, model.n_params, np, w.dtype)
    n_train, batch = len(dataset.y_train), cfg.data.batch_size
    n = serial_steps(cfg, n_train) if steps is None else steps
    for step in range(n):
        idx = sampler.next()
        model.loss_grad(w, dataset.X_train[idx], dataset.y_train[idx], grads[step % 2])
        if step > 0:
            prev = step - 1
            updater.step(w, grads[prev % 2], scheduled_lr(cfg.optim, prev * batch / n_train))
    if n > 0:
        last = n - 1
        updater.step(w, grads[last % 2], scheduled_lr(cfg.optim, last * batch / n_train))
    return w


def train_block_serial(cfg: Config, dataset: Dataset) -> np.ndarray:
    """BMUF or MA with λ = 1 on one process: the reference a ``bmuf``/``ma`` run with one
    learner must reproduce. Blocks of ``protocol.tau`` local steps (``pserver.optim.local_rule``:
    the optimizer state restarts at each block) from the global model, then block momentum on
    the block's update (``pserver.optim.block_momentum``, eqs. 2–6), until the run's samples are
    counted.
    Returns W(T), the model the parallel run's dump holds."""
    from pserver.optim.block_momentum import BlockMomentum
    from pserver.optim.local_rule import LocalRule
    from pserver.protocols.bmuf_block import block_filter

    model = build_model(cfg.model, dataset.n_features, dataset.n_classes, np)
    w_global = model.init_params(cfg.run.seed)
    flt = block_filter(cfg, 1)
    rule = BlockMomentum(flt, w_global.size, np, w_global.dtype)
    n_train, batch = len(dataset.y_train), cfg.data.batch_size
    local = LocalRule(cfg.optim, w_global.size, np, w_global.dtype, (1, flt.tau, batch, n_train))
    sampler = BatchSampler(n_train, batch, cfg.run.seed)
    grad, w, mean = np.empty_like(w_global), np.empty_like(w_global), np.empty_like(w_global)
    blocks = math.ceil(cfg.run.epochs * n_train / (batch * flt.tau))
    for t in range(blocks):
        start = rule.served(w_global)  # W_g(t−1): eq. (5) or (6)
        np.copyto(w, start)
        local.start(t)
        for _ in range(flt.tau):
            idx = sampler.next()
            model.loss_grad(w, dataset.X_train[idx], dataset.y_train[idx], grad)
            local.step(w, grad)
        np.copyto(mean, w)  # W̄(t) of one learner
        rule.step(w_global, mean)
    return w_global

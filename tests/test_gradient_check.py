"""A non-finite gradient is caught where it is computed (issue 22, D6).

On the code before, only the loss was checked: a gradient with one infinite coordinate and a
finite loss was pushed (or averaged, or applied), and the run failed a step later on whichever
learner then computed on the poisoned weights, blaming ``optim.lr``. Now the learner that made
it raises ``Diverged`` naming itself, the step and the minibatch, before its exchange sees it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pserver.errors import Diverged
from pserver.roles.trainer import Trainer


class Model:
    """A model whose loss is finite and whose gradient holds ``bad`` at ``where``."""

    def __init__(self, bad: float, where: int) -> None:
        self.bad, self.where = bad, where

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        grad[:] = 0.5
        grad[self.where] = self.bad
        return 1.25, 0.5


def trainer(model: Model, pushed: list) -> Trainer:
    """A learner's trainer with just what ``step`` reads (no MPI, no context); its exchange
    appends what it is given to ``pushed``."""
    t = Trainer.__new__(Trainer)
    t.index, t.steps, t.consumed, t.xp, t.slow, t.model = 2, 7, 8, np, False, model
    t.cfg = SimpleNamespace(inject=SimpleNamespace(fail_learner=-1), optim=SimpleNamespace(lr=0.1))
    t.ctx = SimpleNamespace(backend=SimpleNamespace(synchronize=lambda: None))
    t.inject = SimpleNamespace(compute_time_for=lambda i, n: 0.0, freeze_for=lambda i, s: 0.0)
    batch = (np.zeros((4, 2), np.float32), np.zeros(4, np.int64))
    t.prefetch = SimpleNamespace(get=lambda: batch, release=lambda: None)
    t.ex = SimpleNamespace(
        have={0: 3},
        freeze_after_weights=False,
        weights=lambda: np.zeros(10, np.float32),
        gradient_buffer=lambda: np.empty(10, np.float32),
        gradient=pushed.append,
    )
    return t


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_gradient_with_a_finite_loss_is_caught_naming_learner_step_minibatch(
    bad: float,
) -> None:
    pushed: list = []
    t = trainer(Model(bad, 5), pushed)
    t.consumed = 7
    with pytest.raises(Diverged) as e:
        t.step()
    said = str(e.value)
    assert said.startswith("learner 2: its gradient at step 7 (minibatch #8 it received)")
    assert "1 NaN or infinite values of 10 (first at parameter 5" in said
    assert "not pushed, averaged or applied" in said
    assert pushed == []


def test_a_finite_gradient_passes() -> None:
    pushed: list = []
    t = trainer(Model(3.0e38, 5), pushed)
    t.account = lambda *times: None  # the train row: records are not under test
    assert t.step()
    assert len(pushed) == 1 and np.isfinite(pushed[0]).all()

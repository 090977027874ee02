"""The learner's loop (pserver.roles.trainer) in one process: a scripted exchange, no MPI."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pserver.ckpt.files import State
from pserver.comm.waiting import PeerLog, Waiter
from pserver.comm.wire import Header, Tag
from pserver.errors import Diverged
from pserver.plan.config import load_config
from pserver.roles.exchange import Exchange
from pserver.roles.trainer import Trainer


class ScriptedExchange(Exchange):
    """Hands out the weights of ``models`` one per minibatch, records every call."""

    relayed_bytes = 7

    def __init__(self, models: list[np.ndarray], freeze_after_weights: bool = False) -> None:
        self.models = list(models)
        self.freeze_after_weights = freeze_after_weights
        self.waiter = Waiter(logging.getLogger("test_trainer"), PeerLog())
        self.have = {0: 3}
        self.calls: list[str] = []
        self.grads: list[np.ndarray] = []
        self.buf = np.zeros_like(models[0])

    def weights(self) -> Any | None:
        self.calls.append("weights")
        return self.models.pop(0) if self.models else None

    def gradient_buffer(self) -> Any:
        self.calls.append("buffer")
        return self.buf

    def gradient(self, g: Any) -> None:
        self.calls.append("gradient")
        assert g is self.buf  # computed into the lent buffer
        self.grads.append(g.copy())

    def staleness(self) -> tuple[float, int]:
        return 0.25, 1

    def done(self) -> float:
        self.calls.append("done")
        return 0.5

    def close(self) -> None:
        self.calls.append("close")

    def finish(self) -> None:
        self.calls.append("finish")

    def state(self) -> State:
        return State({}, {})

    def restore(self, state: State) -> None:
        self.calls.append("restore")


class LinearModel:
    """loss = mean(X @ w), gradient = mean of the rows of X."""

    def loss_grad(self, w: Any, X: Any, y: Any, grad: Any) -> tuple[float, float]:
        grad[:] = X.mean(axis=0)
        return float((X @ w).mean()), 0.0


class FakePrefetch:
    def __init__(self, batches: int, log: list[str]) -> None:
        self.X = np.arange(6, dtype=np.float64).reshape(2, 3)
        self.y = np.zeros(2, dtype=np.int64)
        self.log, self.waited = log, 0.0

    def get(self) -> tuple[Any, Any]:
        self.log.append("get")
        return self.X, self.y

    def release(self) -> None:
        self.log.append("release")

    def close(self) -> None:
        self.log.append("prefetch.close")

    def bye(self, consumed: int = -1) -> None:
        self.log.append("prefetch.bye")


class FakeRecords:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []
        self.closed = self.said_bye = False

    def add(self, group: str, **row: Any) -> None:
        self.rows.append((group, row))

    def maybe_send(self) -> None:
        pass

    def usage(self) -> dict[str, float]:
        return {"cpu_time": 0.0, "run_time": 1.0}

    def close(self, waiter: Waiter) -> None:
        self.closed = True

    def bye(self, header: Any, tag: int, waiter: Waiter) -> None:
        assert Header.unpack(header).kind is Tag.BYE
        self.said_bye = True


def make(overrides: list[str], models: list[np.ndarray], **kw: Any) -> tuple[Any, ...]:
    cfg = load_config(None, ["data.batch_size=2", *overrides])
    records = FakeRecords()
    ctx = SimpleNamespace(
        cfg=cfg,
        xp=np,
        rank=4,
        layout=SimpleNamespace(index=lambda rank: 0),
        records=lambda: records,
        model=LinearModel(),
        now=lambda: 1.0,
        backend=SimpleNamespace(synchronize=lambda: None),
    )
    ex = ScriptedExchange(models, **kw)
    prefetch = FakePrefetch(len(models), ex.calls)
    return Trainer(ctx, ex, prefetch), ex, records


def test_loop_computes_on_each_model_and_reports() -> None:
    models = [np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])]
    trainer, ex, records = make([], models)
    trainer.run()
    step = ["weights", "get", "buffer", "release", "gradient"]
    end = ["weights", "done", "close", "prefetch.close", "finish", "prefetch.bye"]
    assert ex.calls == step + step + end
    assert [g.tolist() for g in ex.grads] == [[1.5, 2.5, 3.5]] * 2
    train = [row for group, row in records.rows if group == "train"]
    assert [r["loss"] for r in train] == [1.5, 2.5]  # X @ w on each model handed out
    assert [r["step"] for r in train] == [0, 1]
    assert train[0]["stale_fraction"] == 0.25 and train[0]["dropped_blocks"] == 1
    (learners,) = [row for group, row in records.rows if group == "learners"]
    assert learners["minibatches"] == 2 and learners["samples"] == 4
    assert learners["relayed_bytes"] == 7
    assert learners["push_time"] >= 0.5  # done()'s blocked seconds count as push time
    assert records.closed and records.said_bye


def test_non_finite_loss_stops_with_the_timestamps_held() -> None:
    trainer, ex, _ = make([], [np.array([np.nan, 0.0, 0.0])])
    with pytest.raises(Diverged, match=r"step 0 \(1 of its weights.*block 0: t=3"):
        trainer.run()
    assert "gradient" not in ex.calls
    assert ex.calls[-2:] == ["close", "prefetch.close"]  # stopped also after an error


def test_injected_failure_at_its_step() -> None:
    models = [np.ones(3)] * 3
    trainer, ex, _ = make(["inject.fail_learner=0", "inject.fail_step=1"], models)
    with pytest.raises(RuntimeError, match="failure injected at step 1"):
        trainer.run()
    assert ex.calls.count("gradient") == 1


@pytest.mark.parametrize("after_weights", [False, True])
def test_freeze_point_is_the_exchanges(
    after_weights: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = [np.ones(3)] * 2
    overrides = ["inject.freeze_learner=0", "inject.freeze_step=1", "inject.freeze_time=2.5"]
    trainer, ex, _ = make(overrides, models, freeze_after_weights=after_weights)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        ex.calls.append("freeze")

    monkeypatch.setattr("pserver.roles.trainer.time.sleep", sleep)
    trainer.run()
    assert slept == [2.5]
    frozen = ex.calls.index("freeze")
    # step 1 is the second minibatch: after its weights, or after its gradient
    before = "weights" if after_weights else "gradient"
    assert ex.calls[frozen - 1] == before
    assert ex.calls[:frozen].count(before) == 2


INTERFACES = {"Protocol", "ABC", "Exchange"}  # interfaces, not drivers


def test_no_role_driver_subclasses_another() -> None:
    """Learners are trainer + exchange by composition: no class in pserver/roles has a base
    but the exchange's declared interface (``pserver.roles.exchange.Exchange``, an ``ABC``)."""
    import ast
    from pathlib import Path

    roles = Path(__file__).resolve().parents[1] / "pserver" / "roles"
    derived = []
    for path in sorted(roles.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [b for b in map(ast.unparse, node.bases) if b not in INTERFACES]
                derived += [f"{path.name}: {node.name}({', '.join(bases)})"] if bases else []
    assert derived == []


def test_the_data_servers_stop_ends_the_loop() -> None:
    """Learners-only (issue 12): once the prefetcher says the run's minibatches are all served
    (``get()`` is None), the loop ends cleanly though the exchange would hand out more."""
    models = [np.array([1.0, 0.0, 0.0])] * 3
    trainer, ex, records = make([], models)
    served = iter([True])
    real_get = trainer.prefetch.get
    trainer.prefetch.get = lambda: real_get() if next(served, False) else None
    trainer.run()
    assert ex.calls.count("gradient") == 1 and ex.calls[-4:] == [
        "close", "prefetch.close", "finish", "prefetch.bye",
    ]
    (learners,) = [row for group, row in records.rows if group == "learners"]
    assert learners["minibatches"] == 1 and records.said_bye


def test_an_exchange_with_rows_of_its_own_writes_them_with_the_trainers() -> None:
    trainer, ex, records = make([], [np.zeros(3)])
    got = []
    ex.attach = got.append
    Trainer(trainer.ctx, ex, trainer.prefetch)
    assert got == [records]


def test_a_periodic_checkpoint_pauses_at_the_first_boundary_past_its_time() -> None:
    """``run.checkpoint_interval``: the loop ends (``paused``, not ``stopped_early``) at the
    first step boundary once the interval has passed since the part began, never before the
    part's first step (each part makes progress), and says goodbye as at a run's end."""
    models = [np.array([1.0, 0.0, 0.0])] * 5
    trainer, ex, records = make(["run.checkpoint_interval=2.5"], models)
    clock = iter([0.0, 9.0, 9.0, 9.0])  # construction at 0; already past due at step 0
    trainer.ctx.now = lambda: next(clock, 9.0)
    trainer.pause_at = 2.5
    trainer.run()
    assert trainer.paused and not trainer.stopped_early
    assert ex.calls.count("gradient") == 1  # the part's one step, then the pause
    assert ex.calls[-5:] == ["done", "close", "prefetch.close", "finish", "prefetch.bye"]
    assert records.said_bye
    idle, _, _ = make([], models)
    assert idle.pause_at == float("inf") and not idle.pause_due()  # 0: never


def test_an_exchange_must_declare_its_checkpoint_record() -> None:
    """The interface the trainer calls is declared (``pserver.roles.exchange``): an exchange
    without ``state``/``restore`` cannot be built, instead of failing at its first checkpoint
    (the trainer used to probe for them)."""

    class NoRecord(ScriptedExchange):
        state = Exchange.state  # abstract again
        restore = Exchange.restore

    with pytest.raises(TypeError, match="abstract"):
        NoRecord([np.zeros(3)])
    every = {"PSExchange", "OverlapExchange", "SyncExchange", "HybridExchange",
             "LocalStepsExchange", "GossipExchange"}  # fmt: skip
    from pserver.job import cli

    classes = [make_class() for make_class in cli.EXCHANGES.values()]
    assert {cls.__name__ for cls in classes} == every
    assert all(issubclass(cls, Exchange) for cls in classes)

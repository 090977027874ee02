"""Statistics batches: the safe encoding, the bounded buffer and what it says when it drops."""

import logging
import math

import pytest

from pserver.comm.records import (
    MAX_SENDS,
    RecordBuffer,
    RecordError,
    RowBudget,
    decode,
    encode,
)


def test_encode_decode_round_trip_keeps_values_exactly():
    import numpy as np

    rows = {
        "train": {"loss": [0.1, float("nan"), math.inf, 1e-300], "step": [np.int64(3), 1, 2, 3]},
        "updates": {"lr": [np.float32(0.5)]},
    }
    got_rows, clocks, dropped = decode(encode(rows, [[0, 1], [2]], {"train": 7}))
    assert got_rows["train"]["step"] == [3, 1, 2, 3]
    loss = got_rows["train"]["loss"]
    assert loss[0] == 0.1 and math.isnan(loss[1]) and loss[2] == math.inf and loss[3] == 1e-300
    assert got_rows["updates"]["lr"] == [0.5]
    assert clocks == [[0, 1], [2]] and dropped == {"train": 7}


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x04K\x01.",  # a pickle: never unpickled
        b"{}",
        b'{"rows": [], "clocks": [], "dropped": {}}',
        b'{"rows": {"g": {"c": 1}}, "clocks": [], "dropped": {}}',
        b'{"rows": {}, "clocks": [1], "dropped": {}}',
        b'{"rows": {}, "clocks": [], "dropped": {"g": -1}}',
    ],
)
def test_decode_refuses_anything_else(data):
    with pytest.raises(RecordError):
        decode(data)


def test_row_budget_drops_beyond_the_bound_but_never_totals():
    b = RowBudget(2)
    assert b.take("train") and b.take("train")
    assert not b.take("train") and not b.take("gradients")
    assert b.take("learners")  # end-of-run totals always fit
    assert b.dropped == {"train": 1, "gradients": 1} and b.total_dropped == 2
    b.release(2)
    assert b.take("train")


class Request:
    def __init__(self) -> None:
        self.done = False

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        return self.done


class Comm:
    """Records the batches; their sends complete only when the test says so."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Request]] = []

    def Issend(self, buf, dest, tag):  # noqa: N802, ANN001, ANN201
        return self.Isend(buf, dest, tag)

    def Isend(self, buf, dest, tag):  # noqa: N802, ANN001, ANN201
        req = Request()
        self.sent.append((bytes(buf[0] if isinstance(buf, list) else buf), req))
        return req


class Waiter:
    def __init__(self) -> None:
        self.whats: list[str] = []

    def waitall(self, reqs, what):  # noqa: ANN001, ANN201
        self.whats.append(what)
        for r in reqs:
            r.done = True  # the statistics server came back

    def wait(self, req, what):  # noqa: ANN001, ANN201
        self.waitall([req], what)


def test_stalled_stats_server_bounds_sends_and_rows_and_says_so(caplog):
    comm = Comm()
    buf = RecordBuffer(comm, 1, interval=0.0, max_rows=10, log=logging.getLogger("t"))
    with caplog.at_level(logging.WARNING, "t"):
        for step in range(100):  # the statistics server never receives: no send completes
            buf.add("train", step=step)
            if step % 2:
                buf.add("updates", timestamp=step)
                buf.add_clock((step,))
            buf.send()  # never blocks
    assert len(comm.sent) == MAX_SENDS <= 10  # bounded sends in flight
    held = sum(len(decode(d)[0].get("train", {}).get("step", [])) for d, _ in comm.sent)
    assert held <= 10
    warnings = [r for r in caplog.records if "buffer full" in r.getMessage()]
    assert len(warnings) == 1  # said once, not once per row
    caplog.clear()
    buf.add("learners", learner=0, minibatches=100)  # the end-of-run row always fits
    waiter = Waiter()
    with caplog.at_level(logging.WARNING, "t"):
        buf.close(waiter)
    assert any("statistics server" in w for w in waiter.whats)
    rows, clocks, dropped = decode(comm.sent[-1][0])
    kept = [s for d, _ in comm.sent for s in decode(d)[0].get("train", {}).get("step", [])]
    assert dropped["train"] + len(kept) == 100
    assert rows["learners"]["minibatches"] == [100]
    # every kept updates row keeps its clock, dropped ones drop theirs
    n_upd = sum(len(decode(d)[0].get("updates", {}).get("timestamp", [])) for d, _ in comm.sent)
    n_clk = sum(len(decode(d)[1]) for d, _ in comm.sent)
    assert n_upd == n_clk and dropped["updates"] + n_upd == 50
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"dropped {sum(dropped.values())} statistics rows" in line and "train: " in line

"""The node's cores as a processor-sharing queue (pserver.sim.cores, ``sim.cores``): a job's
wall time stretches by the jobs runnable per core, its rate changes when another starts or
ends, nothing changes while there are cores enough; the fit recovers ``cores`` and the CPU per
minibatch from a simulated dump; with ``sim.cores`` unset nothing of it runs. One process."""

from __future__ import annotations

from pathlib import Path

import pytest

from pserver.comm.backoff import BACKOFF, Backoff
from pserver.dump.reader import load_dump
from pserver.plan.config import SimConfig, load_config
from pserver.sim.calibrate import calibrate, cores_of
from pserver.sim.cores import Cores, Serial
from pserver.sim.costs import noticed
from pserver.sim.engine import simulate
from pserver.sim.loop import HeapLoop

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "examples" / "quickstart.toml")


def ends(cores: float, jobs: list[tuple[float, float]]) -> dict[int, float]:
    """When each of ``jobs`` ((start, CPU s)) ends on ``cores`` processors."""
    loop, out = HeapLoop(), {}
    queue = Cores(loop, cores)
    for i, (start, cpu) in enumerate(jobs):
        loop.after(start, queue.run, cpu, lambda i=i: out.__setitem__(i, loop.now))
    loop.run()
    return out


def test_two_jobs_on_one_core_take_twice_as_long():
    assert ends(1, [(0.0, 1.0), (0.0, 1.0)]) == pytest.approx({0: 2.0, 1: 2.0})
    assert ends(1, [(0.0, 1.0)]) == pytest.approx({0: 1.0})


def test_a_jobs_rate_changes_when_another_starts_and_ends():
    # job 0 alone for 1 s (1 CPU s), shared with job 1 from t = 1 (each at 1/2): job 1's
    # 0.5 CPU s end at t = 2, when job 0 has 1.5; its last 0.5 alone again: t = 2.5
    assert ends(1, [(0.0, 2.0), (1.0, 0.5)]) == pytest.approx({0: 2.5, 1: 2.0})
    # three jobs on two cores run at 2/3 each until the short one ends
    got = ends(2, [(0.0, 1.0), (0.0, 1.0), (0.0, 2.0 / 3.0)])
    assert got[2] == pytest.approx(1.0)  # 2/3 CPU s at 2/3
    assert got[0] == got[1] == pytest.approx(1.0 + 1.0 / 3.0)  # then the last 1/3 at full rate


def test_with_cores_enough_nothing_changes():
    jobs = [(0.0, 1.0), (0.2, 0.3), (0.4, 2.0), (0.5, 0.1)]
    want = {i: start + cpu for i, (start, cpu) in enumerate(jobs)}
    assert ends(4, jobs) == pytest.approx(want)
    assert ends(3, jobs) == pytest.approx(want)  # at most 3 run at once


def test_a_serial_rank_runs_its_jobs_one_at_a_time():
    loop = HeapLoop()
    queue = Cores(loop, 4)
    stats = Serial(queue)
    for _ in range(3):
        stats.submit(0.5)
    loop.run()
    assert loop.now == pytest.approx(1.5)  # not 0.5: one rank, however many cores


def test_a_bad_core_count_is_refused():
    with pytest.raises(ValueError):
        Cores(HeapLoop(), 0)


def sim(tmp_path: Path, *overrides: str, name: str = "run"):
    cfg = load_config(QUICK, [f"run.out_dir={tmp_path / name}", "run.epochs=2",
                              "cluster.learners=4", "sim.compute_cv=0.5",
                              "protocol.name=async", "inject.compute_time=0.01", *overrides])
    return simulate(cfg)


def test_sharing_cores_slows_a_cpu_bound_run_and_leaves_a_roomy_one_alone(tmp_path):
    keys = ["cluster.learners=16", "sim.compute=0.005", "sim.cpu=0.006"]
    alone = sim(tmp_path, *keys, name="alone")
    roomy = sim(tmp_path, *keys, "sim.cores=64", name="roomy")
    tight = sim(tmp_path, *keys, "sim.cores=1", name="tight")
    # 16 learners' 6 ms of CPU per ~16 ms step need ~6 cores: one core is the bottleneck
    assert tight.sim_time > 2.5 * alone.sim_time
    assert roomy.sim_time == pytest.approx(alone.sim_time, rel=0.15)  # the rest CPU adds 1 ms


def test_the_fit_recovers_cores_and_the_cpu_per_minibatch(tmp_path):
    known = {"cores": 3.0, "cpu": 0.002, "other_cpu": 2e-4}
    # (compute is fitted from the train rows' wall times: stretched where the cores are shared)
    out = sim(tmp_path, *(f"sim.{k}={v}" for k, v in known.items()), "sim.compute=0.001",
              "cluster.learners=8")
    dump = load_dump(out.dump)
    assert cores_of(dump) == (3.0, None)
    fitted = calibrate(out.dump.parent, SimConfig())
    for key, value in known.items():
        assert getattr(fitted, key) == pytest.approx(value, rel=0.1), key


def test_a_dump_without_cores_falls_back_to_this_machine(tmp_path, capsys):
    import h5py

    out = sim(tmp_path)  # sim.cores unset: a core per rank
    assert load_dump(out.dump).attrs["cores"] == 4 + 3
    with h5py.File(out.dump, "a") as f:  # a dump from before the attribute
        del f.attrs["cores"]
    dump = load_dump(out.dump)
    cores, note = cores_of(dump)
    assert cores >= 1 and note and "this machine" in note
    calibrate(out.dump.parent)
    assert "does not record its node's cores" in capsys.readouterr().err


def test_without_cores_no_queue_is_built(tmp_path, monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("Cores built with sim.cores unset")

    monkeypatch.setattr("pserver.sim.engine.Cores", refuse)
    sim(tmp_path)


def test_a_wait_sees_a_message_at_its_next_poll():
    lo, hi = 1e-5, 1e-3
    assert noticed(0.0, lo, hi) == 0.0
    assert noticed(3.5e-5, lo, hi) == pytest.approx(4e-5)  # sleeps of lo first
    for arrival in (1e-4, 7e-4, 3e-3, 7.9e-3):  # then each sleep 1/8 of the time waited
        assert arrival <= noticed(arrival, lo, hi) <= arrival * (1 + BACKOFF) + 1e-12
    for arrival in (9e-3, 0.05, 1.0):  # then sleeps of hi
        assert arrival <= noticed(arrival, lo, hi) <= arrival + hi + 1e-12


def test_polls_make_long_waits_later(tmp_path):
    keys = ["protocol.name=hardsync", "cluster.learners=8", "sim.cores=2"]
    plain = sim(tmp_path, *keys, name="plain")
    polled = sim(tmp_path, *keys, "sim.polls=true", name="polled")
    assert polled.sim_time > plain.sim_time  # every round's replies seen after a sleep
    assert polled.updates == plain.updates


def test_the_cores_other_jobs_held_come_off(tmp_path):
    import h5py

    out = sim(tmp_path, "sim.cores=2", "sim.cpu=0.002", "sim.other_cpu=1e-4")
    dump = load_dump(out.dump)
    own = (dump.attrs["stats_cpu_time"] + float(dump.group("learners")["cpu_time"].sum())
           + float(dump.group("servers")["cpu_time"].sum()))
    wall = dump.attrs["wall_time"]
    with h5py.File(out.dump, "a") as f:  # the node busy 0.75 of a core more than the job
        f.attrs["node_cpu_time"] = own + 0.75 * wall
    cores, note = cores_of(load_dump(out.dump))
    assert cores == pytest.approx(1.25)
    assert "other jobs held 0.75" in note
    with h5py.File(out.dump, "a") as f:  # never below a tenth of the node
        f.attrs["node_cpu_time"] = own + 5 * wall
    assert cores_of(load_dump(out.dump))[0] == pytest.approx(0.2)


@pytest.mark.parametrize("arrival", [0.0, 3.5e-5, 2e-4, 1.3e-3, 8.5e-3, 0.0123, 0.2])
def test_the_polls_follow_the_real_backoff(arrival):
    """``noticed`` is the schedule of ``pserver.comm.backoff.Backoff`` (the simulator drives
    it up to its longest sleep, then counts sleeps of ``hi``), checked here against the
    Backoff stepped on a fake clock to the arrival, past the longest sleep too."""
    now = [0.0]
    lo, hi = 1e-5, 1e-3
    b = Backoff(lo, hi, spin=1, clock=lambda: now[0])
    while now[0] < arrival * (1 - 1e-12):
        now[0] += b.next_sleep()
    assert noticed(arrival, lo, hi) == pytest.approx(now[0], rel=1e-6, abs=1e-12)

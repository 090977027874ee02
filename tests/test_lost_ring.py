"""Issue 22, ADPSGD: the ring of the survivors after a lost learner (``Ring.lose``) and where
the epoch averages go on (``averages_again``), pure, in one process. The exchange that uses
them under Open MPI's ULFM: tests/test_mpi_lost_adpsgd.py."""

from __future__ import annotations

import itertools

import pytest

from pserver.protocols.ring import RECEIVER, SENDER, Goodbyes, Ring, averages_again


def learner_edges(ring: Ring) -> set[frozenset[int]]:
    """The ring's edges in learner ids (what the dump's ``exchanges`` rows name)."""
    return {frozenset(ring.members[p] for p in e) for e in ring.edges()}


def connected(ring: Ring) -> bool:
    seen, todo = {0}, [0]
    while todo:
        for j in ring.neighbours(todo.pop()):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == ring.size


@pytest.mark.parametrize(
    ("lam", "lost", "members", "edges"),
    [
        # λ = 4 → 3: the survivors' path 0–1–3 (odd: the edge back to 0 cut)
        (4, 2, (0, 1, 3), {(0, 1), (1, 3)}),
        # λ = 5 (the path 0–1–2–3–4) → 4: one ring again; keeping the old roles would have split
        # it in two paths 0–1 and 3–4 (1 and 3 both receive)
        (5, 2, (0, 1, 3, 4), {(0, 1), (1, 3), (3, 4), (0, 4)}),
        # λ = 6 → 5: a path of five, the survivors' ends 0 and 5 not joined (two senders)
        (6, 2, (0, 1, 3, 4, 5), {(0, 1), (1, 3), (3, 4), (4, 5)}),
        (4, 0, (1, 2, 3), {(1, 2), (2, 3)}),
        (2, 1, (0,), set()),  # the last learner trains alone
    ],
)
def test_the_survivors_ring(lam, lost, members, edges):
    ring = Ring(lam).lose(lost)
    assert ring.members == members and ring.size == lam - 1
    assert learner_edges(ring) == {frozenset(e) for e in edges}


@pytest.mark.parametrize("lam", range(2, 9))
def test_every_sequence_of_losses_keeps_a_connected_bipartite_ring(lam):
    """Whatever is lost: every edge joins a sender (even position) and a
    receiver (odd), so the wait-for graph stays acyclic (the liveness argument), the graph is
    connected, and a survivor's position is its rank in the communicator shrunk to the
    survivors (their relative order)."""
    for k in range(1, lam):
        for gone in itertools.combinations(range(lam), k):
            ring = Ring(lam)
            for learner in gone:
                ring = ring.lose(learner)
            survivors = sorted(set(range(lam)) - set(gone))
            assert list(ring.members) == survivors
            for learner in survivors:
                assert ring.position(learner) == survivors.index(learner)
            for e in ring.edges():
                assert {ring.role(p) for p in e} == {SENDER, RECEIVER}
            assert connected(ring)
            assert all(len(ring.neighbours(p)) <= 2 for p in range(ring.size))


def test_the_same_losses_in_any_order_give_the_same_ring():
    """Every survivor computes the ring from the set the shrink agreed on, one loss at a time
    in whatever order: it must not matter."""
    assert Ring(6).lose(1).lose(4) == Ring(6).lose(4).lose(1)
    assert Ring(7).lose(0).lose(6).lose(3) == Ring(7).lose(3).lose(0).lose(6)


def test_roles_are_those_of_a_fresh_ring_of_the_survivors():
    ring = Ring(4).lose(2)  # learners 0, 1, 3 at positions 0, 1, 2
    assert [ring.role(p) for p in range(3)] == [SENDER, RECEIVER, SENDER]
    assert ring.partner(0, 0) == 1 and ring.partner(0, 1) == 1  # an end sender: one neighbour
    assert ring.partner(2, 5) == 1  # learner 3 at position 2 now asks learner 1
    book = Goodbyes(ring, 1)  # learner 1 (receiver) awaits the goodbyes of positions 0 and 2
    assert book.expected == {0, 2}


def test_a_ring_of_one_has_no_partner():
    alone = Ring(3).lose(0).lose(2)
    assert alone.members == (1,) and alone.neighbours(0) == ()
    assert alone.role(0) == SENDER
    with pytest.raises(ValueError, match="alone"):
        alone.partner(0, 0)
    with pytest.raises(ValueError, match="last learner"):
        alone.lose(1)


def test_losing_a_learner_not_in_the_ring_is_refused():
    with pytest.raises(ValueError, match="not in the ring"):
        Ring(4).lose(2).lose(2)
    with pytest.raises(ValueError, match="not in the ring"):
        Ring(4).lose(7)
    with pytest.raises(ValueError, match="in order"):
        Ring(3, (2, 1, 0))


@pytest.mark.parametrize(
    ("completed", "inflight", "due", "common", "kept", "again"),
    [
        ([1, 2, 3], 4, [5], 3, [1, 2, 3], [4, 5]),  # nobody completed 4: it is averaged again
        ([1, 2, 3], None, [4], 2, [1, 2], [3, 4]),  # another survivor never completed 3
        ([1, 2], 3, [], 2, [1, 2], [3]),
        ([], None, [], 0, [], []),
        ([2, 4], 6, [8, 10], 1, [2], [4, 6, 8, 10]),  # tested every other epoch
    ],
)
def test_the_epoch_averages_go_on_where_every_survivor_completed(
    completed, inflight, due, common, kept, again
):
    assert averages_again(completed, inflight, due, common) == (kept, again)


def test_more_completed_everywhere_than_here_is_a_bug():
    with pytest.raises(ValueError):
        averages_again([1], None, [], 2)


def test_adpsgd_survives_a_lost_learner_without_periodic_checkpoints():
    from pserver.plan.config import load_config
    from pserver.strategies import survives_lost_learner

    assert survives_lost_learner(load_config(None, ["protocol.name=adpsgd"]))
    periodic = ["protocol.name=adpsgd", "run.checkpoint_interval=5"]
    assert not survives_lost_learner(load_config(None, periodic))

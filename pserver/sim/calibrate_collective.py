"""``--calibrate`` of a learners-only run's dump (SYNC, ADPSGD): the link's latency.

A learners-only dump has no shard rows: ``pserver.sim.calibrate.fit`` fits the compute, the
step's overhead and the job's start and end from its ``train`` rows as for any run, and this
module fits ``latency`` from what the learners waited for each other (``exchanges`` rows),
given ``bandwidth``, ``message_time`` and ``update_per_byte`` (kept, as for every fit):

* SYNC: the learner that joined a step's allreduce last waited for the allreduce alone; the
  median over steps of the shortest wait of the step is the allreduce's time, which is
  linear in ``latency`` (``pserver.sim.collective.allreduce_time``): solved for it;
* ADPSGD: a sender's exchange row waited for its model's trip, the receiver's average and the
  answer's trip (``pserver.sim.gossip``): the median of those, less the bytes' time and the
  average's, is two latencies.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pserver.dump.reader import Dump
from pserver.plan.config import SimConfig
from pserver.plan.inject import InjectPlan
from pserver.protocols.ring import SENDER, Ring
from pserver.sim.collective import allreduce_time
from pserver.sim.costs import Costs

LEARNERS_ONLY = ("sync", "adpsgd")


def latency(dump: Dump, sim: SimConfig) -> float | None:
    """The fitted latency of a SYNC or ADPSGD dump; None for any other (or no rows)."""
    name = dump.config.get("protocol", {}).get("name")
    ex = dump.group("exchanges")
    if name not in LEARNERS_ONLY or not dump.rows("exchanges"):
        return None
    nbytes = int(ex["bytes"][0])
    n = int(dump.attrs.get("n_learners", len(np.unique(ex["learner"]))))
    if name == "sync":
        steps, waits = ex["step"], ex["wait_time"]
        shortest = [float(np.min(waits[steps == s])) for s in np.unique(steps)]
        t = float(np.median(shortest))
        bucket = float(dump.config.get("comm", {}).get("bucket_mib", 16.0))
        at = lambda lat: allreduce_time(  # noqa: E731
            Costs(replace(sim, latency=lat), InjectPlan(), 1, nbytes, 0), n, bucket)
        b, a = at(0.0), at(1.0) - at(0.0)
        return max((t - b) / a, 0.0) if a > 0 else sim.latency
    ring = Ring(n)
    sent = np.array([ring.role(int(k)) == SENDER for k in ex["learner"]])
    if not sent.any():
        return sim.latency
    w = float(np.median(ex["wait_time"][sent]))
    service = sim.message_time + sim.update_per_byte * nbytes
    return max((w - service) / 2.0 - nbytes / sim.bandwidth, 0.0)

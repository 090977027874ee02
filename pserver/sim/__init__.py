"""``pserver-sim``: the parameter-server strategies driven by a discrete-event clock.

The shard's protocol, its block bookkeeping (``pserver.protocols.shard_block.ShardBlock``), the
epoch count, the pull-answer rule and the learner's pull rule (``pserver.protocols.partial_pull``)
are the objects a real run uses; this package only decides *when* each of them is called, from
a cost model (``pserver.sim.costs``), and writes what they decide into the same dump schema
(docs/simulation.md). No MPI is imported here.
"""

"""A crowded node's learners as batch tasks: a woken learner does not preempt its server.

On a node with more ranks than cores, every reply a server sends wakes a learner; Linux's
scheduler lets a task that wakes from a sleep preempt the one running, so the server that
just answered lost its core to the learner it answered, once per reply, while its queue of
other learners' requests waited (docs/performance.md, *Issue 26, third pass*).
``SCHED_BATCH`` (any user may choose it for their own threads; the nice value is kept) tells
the scheduler a task is throughput work: when it wakes it does not preempt the running task
(it waits for the next tick), and it keeps the same share of the CPU. Only the learners take
it; the servers, data and statistics servers keep the normal policy, so their wake-ups still
come first.

Threads inherit the policy of the thread that starts them: this is called before the
learner's prefetch and communication threads exist.
"""

from __future__ import annotations

import logging
import os


def batch_task(log: logging.Logger) -> bool:
    """Make this thread (and the threads it starts later) ``SCHED_BATCH``; False where the
    system has no such policy or refuses it (logged at debug: nothing depends on it)."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError as e:
        log.debug("crowded node: SCHED_BATCH refused (%s); the learner keeps its policy", e)
        return False
    return True

"""Exceptions that end a run before training with one readable message."""


class PserverError(Exception):
    """Base class: the CLI prints ``pserver: error: <message>`` and exits 2."""


class ConfigError(PserverError):
    """A config key, value or combination that cannot run."""


class TopologyError(PserverError):
    """The world size does not fit the requested roles."""


class DataError(PserverError):
    """A dataset file that is missing or malformed."""


class BackendError(PserverError):
    """A device backend (e.g. CuPy on a GPU) that was asked for but cannot be used."""


class RunError(Exception):
    """A failure during training whose message says everything: the CLI prints it on one line
    (no traceback), naming the rank and host, and aborts the job."""


class Diverged(RunError):
    """The training loss became NaN or infinite: the weights it was computed on are lost."""


class PeerLost(RunError):
    """A peer rank died (its process ended, or MPI reported a failed communication with it).

    ``named``: the dead rank was identified; otherwise the MPI error may also be a fault of
    this rank, and its traceback is worth printing.
    """

    def __init__(self, message: str, named: bool = True) -> None:
        super().__init__(message)
        self.named = named


def diverged(
    loss: float, step: int, timestamps: dict[int, int], bad_weights: int, lr: float
) -> Diverged:
    """The error a learner raises when its training loss is not finite; ``bad_weights`` is
    how many of the weights it computed on are NaN or infinite."""
    held = ", ".join(f"block {b}: t={t}" for b, t in sorted(timestamps.items())[:4])
    more = ", ..." if len(timestamps) > 4 else ""
    what = f"{bad_weights} of its weights are NaN or infinite" if bad_weights else (
        "its weights are finite, the activations overflowed"
    )
    return Diverged(
        f"the training loss became {loss} at step {step} ({what}; weights of {held}{more}): "
        f"the run diverged; try a smaller optim.lr (now {lr:g})"
    )


def nonfinite_gradient(
    learner: int,
    step: int,
    minibatch: int,
    bad: int,
    size: int,
    first: int,
    bad_weights: int,
    lr: float,
) -> Diverged:
    """The error a learner raises when the gradient it computed holds NaN or infinite values,
    before it is pushed, averaged or applied: the learner, step and minibatch that made it are
    named here, not one step later by whichever learner then computes on poisoned weights."""
    weights = f"{bad_weights} of its weights were" if bad_weights else "its weights were all"
    return Diverged(
        f"learner {learner}: its gradient at step {step} (minibatch #{minibatch} it received) "
        f"has {bad} NaN or infinite values of {size} (first at parameter {first}; "
        f"{weights} NaN or infinite); it was not pushed, averaged or applied: the run "
        f"diverged; check the data, or try a smaller optim.lr (now {lr:g})"
    )

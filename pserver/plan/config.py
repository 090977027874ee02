"""Typed, validated run configuration.

Precedence is command line (``dotted.key=value``) over the TOML file over the defaults below.
Every error names the key, the bad value and what would be accepted, and is raised before any
rank starts training (each rank validates the same inputs, so all of them fail together).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pserver import strategies
from pserver.errors import ConfigError
from pserver.plan.limits import MAX_CLASSES, MAX_POLL, MAX_SIZE_MIB
from pserver.plan.unused import unused
from pserver.strategies.collective import SHARD_KEYS
from pserver.strategies.parameter_server import round_rule

if typing.TYPE_CHECKING:
    from pserver.plan.inject import InjectPlan


class Sealable:
    """A config part that refuses assignment once sealed (:func:`sealed`): the run's plan
    (``pserver.runtime.context.Plan``) holds its config resolved once, then only read, so a
    driver cannot change what another rank's driver believes the run is."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_sealed", False):
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to {type(self).__name__}.{name}: the plan's config is sealed "
                "(pserver.plan.config.revised makes a changed copy)"
            )
        object.__setattr__(self, name, value)


@dataclass
class RunConfig(Sealable):
    name: str = "run"
    out_dir: str = "runs/{name}/{id}"  # a template: pserver.runtime.rundir
    seed: int = 0
    epochs: int = 10
    device: str = "cpu"
    log_level: str = "info"
    overwrite: bool = False  # replace an existing dump in out_dir
    epoch_basis: str = "applied"  # applied: gradients in updates; computed: also dropped ones
    blas_threads: int = 0  # 0: one per rank unless OMP/OPENBLAS/MKL_NUM_THREADS is set
    # periodic checkpoints (pserver.ckpt.drivers.periodic): seconds between two; 0: only at the
    # run's end and on a signal
    checkpoint_interval: float = 0.0


@dataclass
class ClusterConfig(Sealable):
    servers: int = 1
    learners: int = 0  # 0: every rank left after servers, stats and data server
    tree_fanout: int = 0  # 0: flat (Rudra-base); k >= 2: aggregator tree (Rudra-adv)
    bcast_fanout: int = 0  # 0: every learner pulls upstream; k >= 2: learner broadcast tree (adv*)
    # root: one broadcast tree over every learner, fed from the top (Rudra §III-C, adv*); group:
    # one tree per upstream (shard or leaf aggregator) (pserver.plan.topology.broadcast_tree)
    bcast_tree: str = "root"


@dataclass
class ProtocolConfig(Sealable):
    """Every strategy's keys side by side. Which key belongs to which strategy, its bound and
    its checks are the registry's (``pserver.strategies``; types and defaults tested equal):
    a key the chosen strategy does not use is refused (typed on the command line) or listed at
    start (from the file) (``pserver.plan.unused``)."""

    name: str = "hardsync"
    n: int = 1  # softsync: update after floor(lambda / n) gradients
    lr_policy: str = "auto"  # none, mean, per-gradient, nominal; auto: none (hardsync), mean
    ref_batch: int = 0  # B of sqrt(lambda*mu/B) for hardsync; 0 means data.batch_size
    c: int = 0  # psp: gradients a block aggregates before it may update (0: all λ learners)
    tau1: float = 0.0  # psp: seconds a block waits for more gradients after the c-th
    s: int = 3  # ssp: how many clocks a learner may run ahead of the slowest
    pull_fraction: float = 1.0  # partial pulling: start computing once this share of blocks is in
    tau2: float = 0.0  # partial pulling: seconds to wait for more blocks after that share
    pull_timestamp: str = "auto"  # auto | iteration | block: what a push's round is (rounds.py)
    # PP-ASGD (pserver/optim/prediction.py): pulls get f_S(w, M) = w + M·Σ_{s=1}^{S+1} μ^s, not w
    predict: bool = False
    predict_steps: int = -1  # S; -1: ⌊running mean of the measured staleness⌋
    predict_probe: int = 50  # updates between prediction-error probes (0: none)
    # bmuf / ma (Chen & Huo): local steps per block, block momentum η (-1: 1 - 1/λ), block
    # learning rate ζ, Nesterov (NBM) or classical (CBM) block momentum
    tau: int = 8
    block_momentum: float = -1.0
    block_lr: float = 1.0
    nesterov: bool = True


@dataclass
class OptimConfig(Sealable):
    rule: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    eps: float = 1e-8
    lr_milestones: list[int] = field(default_factory=list)  # epochs where lr is multiplied
    lr_gamma: float = 0.1  # by this factor (step decay)
    # linear warm-up (pserver.optim.rules.scheduled_lr): from warmup_start·lr to lr over this
    # many epochs (fractional allowed; PP-ASGD: 1 epoch from 0; IBM: 10 epochs from 0.1)
    warmup_epochs: float = 0.0
    warmup_start: float = 0.0
    # per-epoch annealing: lr × lr_decay every epoch from epoch lr_decay_from (0-based) on
    # (IBM: 1/√2 from the 11th epoch, lr_decay_from = 10); 1: none
    lr_decay: float = 1.0
    lr_decay_from: int = 1


@dataclass
class ModelConfig(Sealable):
    kind: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [64])
    dtype: str = "float32"
    size_mib: float = 1.0  # kind = "null" only: parameters of a zero-compute model
    channels: list[int] = field(default_factory=lambda: [32, 64])  # kind = "cnn": conv1, conv2
    # kind = "torch" | "python": "path/to/file.py:factory" or "package.module:factory"
    # (docs/models.md)
    module: str = ""
    # a run directory (or its stats.h5) whose final model is this run's w0 (pserver.ckpt.warm_start)
    init_from: str = ""


@dataclass
class DataConfig(Sealable):
    source: str = "digits"
    path: str = ""
    test_path: str = ""
    test_fraction: float = 0.25
    batch_size: int = 32
    prefetch: int = 2
    n_samples: int = 4096  # synthetic only
    n_features: int = 64  # synthetic only
    n_classes: int = 10  # synthetic only
    # auto | none | minmax | standard, from the training set (learners/scaling.py)
    scale: str = "auto"
    dir: str = ""  # fashion-mnist: the IDX files' directory ("": Debian's, learners/fashion.py)
    train_samples: int = 0  # keep the first N training samples (0: all)
    validation: float = 0.0  # hold this share of the training set out and test on it


@dataclass
class BlocksConfig(Sealable):
    split: str = "size"  # size | layer
    count: int = 1  # number of blocks when split = "size"


@dataclass
class CommConfig(Sealable):
    mode: str = "blocking"
    stall_timeout: float = 60.0  # seconds before a waiting rank logs what it waits for
    poll_min: float = 1e-5  # sleeps of a wait: 1/8 of the time waited, in poll_min..poll_max
    poll_max: float = 1e-3
    staging: str = "auto"  # auto: host staging only for GPU buffers without CUDA-aware MPI
    cuda_aware: str = "auto"  # auto | yes | no: whether MPI may read GPU buffers directly
    transport: str = "messages"  # messages | shm: payloads between ranks of a node (comm/shm.py)
    switch_interval: float = 5e-4  # sys.setswitchinterval: how soon a comm thread gets the GIL
    max_inflight: int = 0  # overlap modes, async/softsync: own pushes not yet acknowledged; 0: 2
    versions: int = 0  # weight buffers a block is served from (0: 1 + its readers); versions.py
    # issue 12: the learners-only strategies' allreduce, cut into buckets of this many MiB
    bucket_mib: float = 16.0
    # issue 26: on a node with more ranks than cores, waits that a peer's message ends sleep
    # on a doorbell (comm/doorbell.py) and learners are batch tasks (comm/crowd.py); off: not
    crowded: str = "auto"


@dataclass
class InjectConfig(Sealable):
    """Deterministic slow-downs for experiments (same names as
    ``pserver.plan.inject.InjectPlan``)."""

    pull_delay_prob: float = 0.0  # each pull reply is delayed with this probability ...
    pull_delay: float = 0.0  # ... by this many seconds (PSP-SGD §4.2: 0.0016 and 4 s)
    slow_server: int = -1  # this shard handles every message server_factor times slower
    server_factor: float = 1.0
    slow_learner: int = -1  # this learner computes learner_factor times longer
    learner_factor: float = 1.0
    compute_time: float = 0.0  # seconds added to every minibatch (the rank sleeps: an idle GPU)
    fail_learner: int = -1  # raise an exception on this learner (tests the abort path)
    freeze_learner: int = -1  # this learner sleeps freeze_time s without calling MPI ...
    freeze_step: int = 0  # ... after its push (and pull request) of this minibatch
    freeze_time: float = 0.0
    fail_step: int = 0  # ... at this minibatch
    # issue 22: the failing learner sends itself SIGKILL instead (a lost learner, no message)
    fail_kill: bool = False
    # issue 15: seconds added per sample of the minibatch (compute that grows with μ, Rudra §V-B)
    compute_per_sample: float = 0.0


@dataclass
class StatsConfig(Sealable):
    flush_interval: float = 2.0
    buffer_rows: int = 50_000  # statistics rows a rank holds for a lagging stats server
    test_every: int = 1  # epochs between model tests at the statistics server
    progress: bool = True
    # issue 24: progress lines between the epoch tests, at most one per this many seconds (0: none)
    progress_every: float = 0.0
    tensorboard: bool = False  # TensorBoard scalars in the run directory (pserver.dump.tensorboard)


@dataclass
class SimConfig(Sealable):
    """The cost model of ``pserver-sim`` (``pserver.sim.costs``, docs/simulation.md); a real run
    reads none of it. ``pserver-sim --calibrate RUN_DIR`` fits these from a real run's dump."""

    loop: str = "heap"  # heap | simpy: the event loop (pserver.sim.loop)
    compute: float = 1e-3  # s of model compute per minibatch (mean), before [inject]'s
    compute_cv: float = 0.0  # coefficient of variation of it (lognormal, per learner and step)
    step_overhead: float = 0.0  # s a learner spends per step outside compute and its waits
    latency: float = 5e-5  # s per message between a learner and its shard, either way
    latency_cv: float = 0.0  # coefficient of variation of a reply's latency (lognormal)
    bandwidth: float = 1e9  # bytes/s of that link (weights and gradients)
    message_time: float = 1e-5  # s of the shard's handling of any message (push, pull, bye)
    update_per_byte: float = 1e-9  # s of the shard per byte of a pushed gradient (take + update)
    data_time: float = 0.0  # s of the data server per minibatch served
    start_time: float = 0.0  # s from the job's start to the learners' first minibatch
    end_time: float = 0.0  # s from the last message to the job's end (last test, dump)
    # processors the node's ranks share (pserver.sim.cores); 0: one per rank, no sharing
    cores: float = 0.0
    cpu: float = 0.0  # CPU s of a learner per minibatch in all (with cores; 0: its compute)
    other_cpu: float = 0.0  # CPU s of the statistics server per minibatch (with cores)
    polls: bool = False  # waits poll with comm.poll_min..poll_max back-off (pserver.sim.costs)
    # a link of the aggregator tree (cluster.tree_fanout; pserver.sim.tree): 0 takes latency,
    # bandwidth
    tree_latency: float = 0.0  # s per message between a tree node and its parent, either way
    tree_bandwidth: float = 0.0  # bytes/s of that link
    # a link of the learners' broadcast tree (cluster.bcast_fanout): 0 takes latency, bandwidth
    bcast_latency: float = 0.0  # s per message between a learner and its parent learner
    bcast_bandwidth: float = 0.0  # bytes/s of that link


@dataclass
class Config(Sealable):
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    blocks: BlocksConfig = field(default_factory=BlocksConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    inject: InjectConfig = field(default_factory=InjectConfig)
    sim: SimConfig = field(default_factory=SimConfig)  # pserver-sim only
    # the keys given in the file or the overrides ("section.key"), recorded by build(): a key
    # is "set" when it was given, even at its default value
    given: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)
    # those of ``given`` typed on the command line: an override the run would not read is an
    # error, a file's key only listed (pserver.plan.unused)
    overridden: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)
    # the file's shard keys a learners-only strategy cannot read, reset to their defaults so that
    # they take no effect: key -> the file's value (listed at start, pserver.plan.unused)
    set_aside: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}


SECTIONS = tuple(
    f.name for f in dataclasses.fields(Config) if f.name not in ("given", "overridden", "set_aside")
)


def sealed(cfg: Config) -> Config:
    """A copy of ``cfg`` whose sections refuse assignment (the plan's: ``Plan.cfg``)."""
    return _seal(copy.deepcopy(cfg))


def revised(cfg: Config, section: str, **changes: Any) -> Config:
    """A sealed copy of ``cfg`` with ``changes`` in ``section``: how preparation resolves a key
    (``model.init_from``, ``run.out_dir``) into the plan instead of writing it back."""
    part = dataclasses.replace(getattr(cfg, section), **changes)
    return _seal(copy.deepcopy(dataclasses.replace(cfg, **{section: part})))


def is_sealed(cfg: Config) -> bool:
    return all(getattr(p, "_sealed", False) for p in (cfg, *(getattr(cfg, s) for s in SECTIONS)))


def _seal(cfg: Config) -> Config:
    for part in (cfg, *(getattr(cfg, s) for s in SECTIONS)):
        object.__setattr__(part, "_sealed", True)
    return cfg


CHOICES: dict[str, tuple[str, ...]] = {
    "run.device": ("cpu", "gpu", "auto"),
    "run.log_level": ("debug", "info", "warning", "error"),
    "run.epoch_basis": ("applied", "computed"),
    "cluster.bcast_tree": ("root", "group"),
    "protocol.name": strategies.names(),
    "protocol.lr_policy": ("auto", "none", "mean", "per-gradient", "nominal"),
    "protocol.pull_timestamp": ("auto", "iteration", "block"),
    "optim.rule": ("sgd", "momentum", "nesterov", "adagrad"),
    "model.kind": ("softmax", "mlp", "null", "cnn", "torch", "python"),
    "model.dtype": ("float32", "float64"),
    "data.source": ("digits", "synthetic", "hdf5", "fashion-mnist"),
    "data.scale": ("auto", "none", "minmax", "standard"),
    "blocks.split": ("size", "layer"),
    "comm.mode": ("blocking", "nonblocking", "thread"),
    "comm.staging": ("auto", "always", "never"),
    "comm.cuda_aware": ("auto", "yes", "no"),
    "comm.transport": ("messages", "shm"),
    "comm.crowded": ("auto", "off"),
    "sim.loop": ("heap", "simpy"),
}

POSITIVE = {
    "run.epochs",
    "optim.lr",
    "optim.lr_gamma",
    "optim.lr_decay",
    "optim.lr_decay_from",
    "data.batch_size",
    "data.prefetch",
    "data.n_samples",
    "data.n_features",
    "data.n_classes",
    "model.size_mib",
    "blocks.count",
    "comm.stall_timeout",
    "comm.poll_min",
    "comm.poll_max",
    "comm.switch_interval",
    "comm.bucket_mib",
    "stats.flush_interval",
    "stats.buffer_rows",
    "stats.test_every",
    "sim.bandwidth",
}
NON_NEGATIVE = {
    "run.blas_threads",
    "run.checkpoint_interval",
    "cluster.servers",  # > 0 for the strategies with server shards (check_ranks)
    "comm.max_inflight",
    "cluster.learners",
    "cluster.tree_fanout",
    "cluster.bcast_fanout",
    "comm.versions",
    "optim.momentum",
    "optim.warmup_epochs",
    "optim.warmup_start",
    "optim.weight_decay",
    "optim.eps",
    "run.seed",
    "inject.compute_time",
    "inject.fail_step",
    "inject.compute_per_sample",
    "stats.progress_every",
    "sim.compute",
    "sim.compute_cv",
    "sim.step_overhead",
    "sim.latency",
    "sim.message_time",
    "sim.update_per_byte",
    "sim.data_time",
    "sim.latency_cv",
    "sim.start_time",
    "sim.end_time",
    "sim.cores",
    "sim.cpu",
    "sim.other_cpu",
    "sim.tree_latency",
    "sim.tree_bandwidth",
    "sim.bcast_latency",
    "sim.bcast_bandwidth",
}
# the bounds of the strategies' own keys (protocol.n > 0, protocol.c >= 0, ...)
POSITIVE |= {f"protocol.{k}" for k, p in strategies.params().items() if p.bound == "> 0"}
NON_NEGATIVE |= {f"protocol.{k}" for k, p in strategies.params().items() if p.bound == ">= 0"}


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path`` (TOML), apply ``key=value`` overrides, validate, and return the config."""
    try:
        return _load(path, overrides)
    except RecursionError:  # tomllib and repr recurse once per level of [[[...]]] or {a={...}}
        raise ConfigError(
            "the config nests tables or lists thousands of levels deep; every pserver key "
            "takes a number, a string, a boolean or a flat list"
        ) from None


def _load(path: str | Path | None, overrides: list[str] | tuple[str, ...]) -> Config:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {str(p)!r} is a directory, expected a TOML file")
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            raw = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
        except OSError as e:
            raise ConfigError(f"config file {str(p)!r} cannot be read: {e.strerror}") from None
    typed = apply_overrides(raw, overrides)
    cfg = build(raw)
    cfg.overridden = frozenset(typed)
    return validate(cfg)


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> set[str]:
    """Set each ``section.key=value`` of ``overrides`` in the tables ``raw``; the keys typed."""
    typed = set()
    for item in overrides:
        key, value = parse_override(item)
        section, _, name = key.partition(".")
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{section!r} must be a table, not {raw[section]!r}")
        raw[section][name] = value
        typed.add(key)
    return typed


def load_resolved(
    tables: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """The config of a resolved ``Config.to_dict()`` (a checkpoint's) with ``overrides`` on
    top. Only the overrides count as given: the tables are a validated run's whole config, not
    a file a user wrote, so none of their keys is listed as unread or set aside again."""
    import copy

    raw = copy.deepcopy(tables)
    try:
        typed = apply_overrides(raw, overrides)
    except RecursionError:  # as load_config: an override nested thousands of levels deep
        raise ConfigError("an override nests lists or tables thousands of levels deep") from None
    cfg = build(raw)
    cfg.given = cfg.overridden = frozenset(typed)
    return validate(cfg)


def parse_override(item: str) -> tuple[str, Any]:
    """``protocol.n=4`` -> ("protocol.n", 4); values are read as TOML, bare words as strings."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or key.count(".") != 1 or not all(key.split(".")):
        raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    return key, value


def build(raw: dict[str, Any]) -> Config:
    """The config of the tables in ``raw`` over the defaults; ``given`` records their keys."""
    cfg = Config()
    sections = set(SECTIONS)
    given: set[str] = set()
    for section, table in raw.items():
        if section not in sections:
            raise ConfigError(
                f"unknown config section [{section}]; known: {', '.join(sorted(sections))}"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"[{section}] must be a table, got {table!r}")
        target = getattr(cfg, section)
        hints = typing.get_type_hints(type(target))
        for key, value in table.items():
            if key not in hints:
                known = ", ".join(sorted(hints))
                raise ConfigError(f"unknown config key {section}.{key}; [{section}] has: {known}")
            setattr(target, key, coerce(f"{section}.{key}", value, hints[key]))
            given.add(f"{section}.{key}")
    cfg.given = frozenset(given)
    return cfg


def coerce(key: str, value: Any, hint: Any) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} = {value!r}: expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} = {value!r}: expected an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ConfigError(f"{key} = {value!r}: expected a finite number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} = {value!r}: expected a string")
    if typing.get_origin(hint) is list:
        if isinstance(value, list):
            (item_hint,) = typing.get_args(hint)
            return [coerce(f"{key}[{i}]", v, item_hint) for i, v in enumerate(value)]
        raise ConfigError(f"{key} = {value!r}: expected a list")
    raise ConfigError(f"{key}: unsupported type {hint}")  # pragma: no cover


def get(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def validate(cfg: Config) -> Config:
    for key, allowed in CHOICES.items():
        value = get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key} = {value!r}: expected one of {', '.join(allowed)}")
    for key in POSITIVE:
        if not get(cfg, key) > 0:
            raise ConfigError(f"{key} = {get(cfg, key)!r}: expected a value > 0")
    for key in NON_NEGATIVE:
        if not get(cfg, key) >= 0:
            raise ConfigError(f"{key} = {get(cfg, key)!r}: expected a value >= 0")
    if any(ord(c) < 32 or ord(c) == 127 for c in cfg.run.name):
        # it names a directory (runs/{name}/...), the dump's attributes and log lines
        raise ConfigError(
            f"run.name = {cfg.run.name!r}: expected no control character (newline, tab, ...)"
        )
    strategy = strategies.lookup(cfg.protocol.name)
    set_aside_shard_keys(strategy, cfg)
    default_servers(strategy, cfg)
    check_ranks(strategy, cfg)
    inject_plan(cfg).validate()
    strategy.check(cfg)  # the strategy's cross-field checks (pserver/strategies/)
    if cfg.comm.transport == "shm" and (
        cfg.comm.mode != "blocking"
        or cfg.cluster.tree_fanout
        or cfg.cluster.bcast_fanout
        or cfg.protocol.pull_fraction < 1.0
    ):
        raise ConfigError(
            'comm.transport = "shm": a learner computes its next gradient in the window the '
            "server reads, which is safe only once every block's pull has been answered: it "
            'needs comm.mode = "blocking", no trees (cluster.tree_fanout = 0, '
            "cluster.bcast_fanout = 0) and protocol.pull_fraction = 1"
        )
    if cfg.cluster.bcast_fanout == 1:
        raise ConfigError("cluster.bcast_fanout = 1: expected 0 (none) or a fan-out >= 2")
    if cfg.cluster.bcast_fanout and cfg.comm.mode == "blocking":
        raise ConfigError(
            "cluster.bcast_fanout: learners relay weights from their communication engine; "
            'set comm.mode = "thread" or "nonblocking" (Rudra-adv*)'
        )
    if cfg.comm.versions == 1:
        raise ConfigError(
            "comm.versions = 1: a block served from one buffer must wait for every receiver "
            "before it updates; expected 0 (one more than the block's readers) or >= 2"
        )
    if cfg.cluster.tree_fanout == 1:
        raise ConfigError("cluster.tree_fanout = 1: expected 0 (flat) or a fan-out >= 2")
    if not 0.0 < cfg.data.test_fraction < 1.0:
        raise ConfigError(
            f"data.test_fraction = {cfg.data.test_fraction!r}: expected a value in (0, 1)"
        )
    if cfg.data.source == "hdf5" and not cfg.data.path:
        raise ConfigError('data.source = "hdf5" needs data.path, the HDF5 file with X and y')
    check_schedule(cfg.optim)
    m = cfg.optim.lr_milestones
    if any(e <= 0 for e in m) or any(b <= a for a, b in zip(m, m[1:], strict=False)):
        raise ConfigError(
            f"optim.lr_milestones = {m!r}: expected increasing epochs >= 1, e.g. [10, 15]"
        )
    if cfg.model.kind in ("torch", "python") and not cfg.model.module.strip():
        raise ConfigError(
            f'model.kind = "{cfg.model.kind}" needs model.module, the file or module and the '
            'function that builds the model, e.g. model.module = "examples/torch_cnn.py:build"'
        )
    if any(h <= 0 for h in cfg.model.hidden):
        raise ConfigError(f"model.hidden = {cfg.model.hidden!r}: expected positive layer widths")
    if cfg.comm.poll_min > cfg.comm.poll_max:
        raise ConfigError(
            f"comm.poll_min = {cfg.comm.poll_min} exceeds comm.poll_max = {cfg.comm.poll_max}"
        )
    validate_bounds(cfg)
    refused, _ = unused(cfg)
    if refused:
        raise ConfigError(refused[0])
    return cfg


def check_schedule(o: OptimConfig) -> None:
    """The warm-up and annealing shares: a factor outside (0, 1] would grow the rate."""
    if o.warmup_start > 1.0:
        raise ConfigError(
            f"optim.warmup_start = {o.warmup_start!r}: expected a share of optim.lr in [0, 1] "
            "(the warm-up rises from warmup_start·lr to lr)"
        )
    if o.lr_decay > 1.0:
        raise ConfigError(
            f"optim.lr_decay = {o.lr_decay!r}: expected a factor in (0, 1] (the rate is "
            "multiplied by it every epoch from optim.lr_decay_from on; 1: no annealing)"
        )


def unread(cfg: Config) -> list[str]:
    """The config file's keys this run does not read (``key = value (owner)``, from
    ``pserver.plan.unused``): rank 0 lists them once at start, at INFO level."""
    return unused(cfg)[1]


def set_aside_shard_keys(strategy: strategies.Strategy, cfg: Config) -> None:
    """A learners-only strategy run from a file written for a comparison (``examples/psp.toml``
    with ``protocol.name=sync``): the file's shard keys (``cluster.servers``, trees, blocks,
    shard faults) are reset to their defaults, so that none takes effect, and listed at start.
    Typed on the command line they are refused (``pserver.strategies.collective``)."""
    if strategy.ranks.servers:
        return
    defaults = Config()
    defaults.cluster.servers = 0  # a learners-only run has no shard
    for key in ("cluster.servers", *SHARD_KEYS):
        if key in cfg.given and key not in cfg.overridden:
            section, name = key.split(".")
            cfg.set_aside[key] = get(cfg, key)
            setattr(getattr(cfg, section), name, get(defaults, key))


def default_servers(strategy: strategies.Strategy, cfg: Config) -> None:
    """A learners-only strategy runs no shard: ``cluster.servers`` not given means 0 there
    (a given nonzero value is refused by :func:`check_ranks`)."""
    if not strategy.ranks.servers and (
        "cluster.servers" not in cfg.given or "cluster.servers" in cfg.set_aside
    ):
        cfg.cluster.servers = 0


def check_ranks(strategy: strategies.Strategy, cfg: Config) -> None:
    """``cluster.servers`` against the ranks the strategy needs (``Strategy.ranks``)."""
    n = cfg.cluster.servers
    if strategy.ranks.servers and n < 1:
        raise ConfigError(
            f"cluster.servers = {n}: expected a value > 0; protocol.name = {strategy.name!r} "
            "keeps the model on parameter-server shards"
        )
    if not strategy.ranks.servers and n:
        raise ConfigError(
            f"cluster.servers = {n}: protocol.name = {strategy.name!r} runs without "
            "parameter-server shards; set cluster.servers = 0"
        )


def pull_timestamp(cfg: Config) -> str:
    """The round a push answers: ``"iteration"`` or ``"block"`` (pserver/protocols/rounds.py,
    resolved by the family's rule, ``pserver.strategies.parameter_server.round_rule``)."""
    return round_rule(strategies.lookup(cfg.protocol.name), cfg)


def validate_bounds(cfg: Config) -> None:
    """Upper bounds: values no run needs, which would otherwise hang a job or overflow."""
    if cfg.comm.poll_max > MAX_POLL:
        raise ConfigError(
            f"comm.poll_max = {cfg.comm.poll_max}: expected at most {MAX_POLL} s; a waiting "
            "rank sleeps up to poll_max between tests, so every message it waits for can "
            "arrive that much late (the default 1e-3 costs at most 1 ms per wait)"
        )
    if cfg.data.n_classes > MAX_CLASSES:
        raise ConfigError(
            f"data.n_classes = {cfg.data.n_classes}: expected at most {MAX_CLASSES:,}"
        )
    if cfg.model.size_mib > MAX_SIZE_MIB:
        raise ConfigError(
            f"model.size_mib = {cfg.model.size_mib}: expected at most {MAX_SIZE_MIB:.0f} MiB"
        )
    check_fail_learner(cfg)


def check_fail_learner(cfg: Config, n_learners: int | None = None) -> None:
    """inject.fail_learner is checked as inject.slow_learner is: a fault aimed at nobody
    would otherwise pass silently (with ``n_learners``, also against the learners)."""
    from pserver.plan.inject import InjectPlan

    InjectPlan.check_index("fail_learner", cfg.inject.fail_learner, n_learners, "learners")


def inject_plan(cfg: Config) -> InjectPlan:
    """The injection plan of ``[inject]``, seeded by ``run.seed``."""
    from pserver.plan.inject import InjectPlan

    i = cfg.inject
    return InjectPlan(
        seed=cfg.run.seed, pull_delay_prob=i.pull_delay_prob, pull_delay=i.pull_delay,
        slow_server=i.slow_server, server_factor=i.server_factor, slow_learner=i.slow_learner,
        learner_factor=i.learner_factor, compute_time=i.compute_time,
        freeze_learner=i.freeze_learner, freeze_step=i.freeze_step, freeze_time=i.freeze_time,
        compute_per_sample=i.compute_per_sample,
    )

"""One declaration per algorithm: its config class and its stages.

Everything else is derived from a :class:`Pipeline` (with its ``dataloader`` and
``data_setup``, the functions that build its training data): the flow body (each due stage in
order, fed the outputs of the stages it reads), which stages go stale when one is rerun
(the transitive readers), the inputs that decide whether a stored stage is still valid
(the config, what it reads, the versions it depends on), the metrics reported per
iteration, and which config class a stored run validates into (the section it holds).
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_core.pipeline.context import StageContext, StageResult

# What a stage's output depends on besides the config and the stages it reads: the weights
# of a trained model at the start of the iteration, or where the dataloader stood.
Version = Literal["policy", "value", "dataloader"]
# Refill round r > 0 of stage "reward" is recorded as "reward.r" in the manifest.
_ROUND = "."


def round_name(name: str, round_index: int) -> str:
    return name if round_index == 0 else f"{name}{_ROUND}{round_index}"


def split_round(recorded: str) -> tuple[str, int]:
    """``("reward", 2)`` for ``"reward.2"``; ``("reward", 0)`` for ``"reward"``."""
    name, _, suffix = recorded.partition(_ROUND)
    return (name, int(suffix)) if suffix.isdigit() else (recorded, 0)


@dataclass(frozen=True)
class Refill:
    """Consecutive stages that run again, round after round, until the last of them says in
    its ``complete_output`` JSON (``{"complete": bool}``) that its batch is complete: DAPO's
    dynamic sampling refills a batch from more generation. Round r of each stage reads its
    own round r-1 as ``previous`` (the dataloader position, the samples kept so far)."""

    stages: tuple[str, ...]
    enabled: Callable[[Any], bool]
    complete_output: str = "selection"


@dataclass(frozen=True)
class FanOut:
    """A stage whose work splits by sample. ``shard(ctx, index, count)`` makes the ``batch`` of
    one contiguous slice; ``merge(ctx, batches)`` joins the slices' batches in order and does
    the rest of the stage. Unsplit, the stage is one shard merged, so its output is the same
    bit for bit however many shards made it. ``widest(config)``: the most shards the stage's
    batch splits into under ``config``, and why no more (a shard holds whole units of the
    work: samples, or the batches a backend computes together)."""

    shard: "Callable[[StageContext, int, int], BatchedDataDict]"
    merge: "Callable[[StageContext, list[BatchedDataDict]], StageResult]"
    widest: Callable[[Any], tuple[int, str]]


@dataclass(frozen=True)
class RunAhead:
    """Consecutive stages of later iterations that run while this one trains (asynchronous
    GRPO): those of iterations i+1..i+depth run beside iteration i's training. The
    ``lagged`` among them use the weights ``depth`` steps older than their iteration's
    (never before the initial model): fixed by the iteration, not by whichever checkpoint
    is newest when they start, so a resumed run or a rerun stage computes them again from
    the same weights. ``depth(config)`` is 0 when the run does not overlap."""

    stages: tuple[str, ...]
    lagged: tuple[str, ...]
    depth: Callable[[Any], int]


SHARD_PREFIX = "shard-"


def shard_part(index: int, count: int) -> str:
    """The name a shard is recorded under, beside its stage's outputs."""
    return f"{SHARD_PREFIX}{index}-of-{count}"


def shard_bounds(size: int, index: int, count: int, unit: int = 1) -> tuple[int, int]:
    """Sample range ``[start, end)`` of shard ``index`` of ``count`` over ``size`` samples, in
    whole units of ``unit`` samples (the last unit may be short)."""
    units = -(-size // unit)
    if count > units:
        raise ValueError(f"{size} samples in units of {unit} split into at most {units} shards")
    return min(size, index * units // count * unit), min(size, (index + 1) * units // count * unit)


@dataclass(frozen=True)
class Stage:
    """One stage: ``compute`` (a core function of the stage's context) and what it depends on.

    ``reads``: stages of the same iteration whose outputs it takes; ``optional_reads``:
    stages it takes when they ran (they are not due every iteration); ``versions``: what
    else decides its output; ``reported``: its metrics shown per iteration; ``commits``: it
    commits the checkpoint the next iteration starts from; ``due(config, iteration,
    final_step)``: whether it runs at an iteration (None: at every training iteration,
    those before ``final_step``); ``fan_out``: how its work splits into shards that run
    concurrently (``orchestration.fan_out`` says into how many); ``sharded(config)``: its
    model is sharded over the training world as the trained policy is (the teacher), so it
    runs on the training stage's ranks too.
    """

    name: str
    compute: "Callable[[StageContext], StageResult]"
    reads: tuple[str, ...] = ()
    optional_reads: tuple[str, ...] = ()
    versions: tuple[Version, ...] = ()
    reported: tuple[str, ...] = ()
    commits: bool = False
    due: Callable[[Any, int, int], bool] | None = None
    fan_out: FanOut | None = None
    sharded: Callable[[Any], bool] | None = None

    def spans_ranks(self, config: Any) -> bool:
        """Whether it runs on the training ranks where the training world has several: the
        committing stage, and a stage whose model is sharded like the trained one."""
        return self.commits or (self.sharded is not None and self.sharded(config))

    def is_due(self, config: Any, iteration: int, final_step: int) -> bool:
        if self.due is None:
            return iteration < final_step
        return self.due(config, iteration, final_step)

    @property
    def all_reads(self) -> tuple[str, ...]:
        return (*self.reads, *self.optional_reads)


@dataclass(frozen=True)
class Pipeline:
    """An algorithm: ``name`` is its flow's name and its config's section (``grpo:``)."""

    name: str
    config_class: type[BaseModel]
    stages: tuple[Stage, ...]
    default_config: str
    # Keys a continued run must keep (dotted): it must train the same model on the same data.
    identity_keys: tuple[str, ...] = ()
    refill: Refill | None = None
    run_ahead: RunAhead | None = None
    # ``dataloader(config, tokenizer)``: the training data's loader (its state is the
    # "dataloader" version); ``data_setup(config)``: what the datasets take beyond ``data:``.
    dataloader: Callable[[Any, Any], Any] | None = None
    data_setup: Callable[[Any], Any] | None = None
    # Whether its policy keeps the starting weights as the reference (KL terms); SFT's does not.
    reference_policy: bool = True
    # Whether its data is text that the policy's tokenizer reads (the ``dataloader`` gets the
    # tokenizer); a pipeline over other data (tests/orchestration's toy) loads none.
    tokenized: bool = True
    # ``preflight(config)``: checks that need the run's models built (a teacher's vocabulary
    # against the student's), run before any of the run is written.
    preflight: Callable[[Any], None] | None = None
    _by_name: dict[str, Stage] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Stage] = {}
        for stage in self.stages:
            if stage.name in by_name:
                raise ValueError(f"pipeline {self.name!r} declares stage {stage.name!r} twice")
            unknown = [r for r in stage.all_reads if r not in by_name]
            if unknown:
                raise ValueError(
                    f"pipeline {self.name!r}: stage {stage.name!r} reads {unknown}, "
                    "which are not declared before it"
                )
            by_name[stage.name] = stage
        if sum(stage.commits for stage in self.stages) > 1:
            raise ValueError(f"pipeline {self.name!r} has more than one committing stage")
        names = [stage.name for stage in self.stages]
        for group, kind in ((self.refill, "refill"), (self.run_ahead, "run-ahead")):
            if group is not None and not _consecutive(names, group.stages):
                raise ValueError(
                    f"pipeline {self.name!r}: {kind} stages {group.stages} must be "
                    "consecutive declared stages"
                )
        object.__setattr__(self, "_by_name", by_name)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)

    def stage(self, name: str) -> Stage:
        """The stage of a name as declared or as recorded (``reward.2``: refill round 2)."""
        name = split_round(name)[0]
        if name not in self._by_name:
            raise KeyError(
                f"{self.name} has no stage {name!r}; its stages are {list(self.stage_names)}"
            )
        return self._by_name[name]

    @property
    def committing_stage(self) -> Stage | None:
        """The stage that commits the next iteration's checkpoint; None for a pipeline that
        trains nothing (eval scores the weights it is given)."""
        return next((stage for stage in self.stages if stage.commits), None)

    def downstream_of(self, name: str) -> list[str]:
        """``name`` and every stage that reads it, directly or through others, in order."""
        affected = {self.stage(name).name}
        for stage in self.stages:
            if affected.intersection(stage.all_reads):
                affected.add(stage.name)
        return [stage for stage in self.stage_names if stage in affected]

    def refilling(self, config: Any) -> bool:
        return self.refill is not None and self.refill.enabled(config)

    def ahead_depth(self, config: Any) -> int:
        """How many later iterations' run-ahead stages overlap one's training (0: none)."""
        return 0 if self.run_ahead is None else self.run_ahead.depth(config)

    def lags(self, config: Any, name: str) -> bool:
        """Whether stage ``name`` reads weights older than its iteration's in this run."""
        lagged = self.run_ahead is not None and split_round(name)[0] in self.run_ahead.lagged
        return lagged and self.ahead_depth(config) > 0

    def weights_step(self, config: Any, name: str, iteration: int) -> int:
        """The step whose weights stage ``name`` of ``iteration`` reads: its own, or, for a
        lagged run-ahead stage, the one ``ahead_depth`` steps before (at least step 0)."""
        if not self.lags(config, name):
            return iteration
        return max(0, iteration - self.ahead_depth(config))

    def last_iteration(self, config: Any, final_step: int) -> int:
        """One past the last iteration with a due stage: ``final_step``, plus one when a stage
        (validation at the end) is due for the weights of the final step."""
        due_at_final = any(stage.is_due(config, final_step, final_step) for stage in self.stages)
        return final_step + 1 if due_at_final else final_step

    def reported_metrics(self) -> Iterator[tuple[str, str]]:
        for stage in self.stages:
            for metric in stage.reported:
                yield stage.name, metric


def _consecutive(names: list[str], group: tuple[str, ...]) -> bool:
    first = names.index(group[0]) if group[0] in names else -1
    return first >= 0 and names[first : first + len(group)] == list(group)


def declared(pipeline: Pipeline, name: Literal["dataloader", "data_setup"]) -> Callable:
    """The pipeline's ``dataloader`` or ``data_setup``; an algorithm without training data
    (evaluation) declares none and must not ask for one."""
    found = getattr(pipeline, name)
    if found is None:
        raise ValueError(f"pipeline {pipeline.name!r} declares no {name}")
    return found


_PIPELINES: dict[str, Pipeline] = {}


def register_pipeline(pipeline: Pipeline) -> Pipeline:
    _PIPELINES[pipeline.name] = pipeline
    return pipeline


@contextmanager
def registered_for(pipeline: Pipeline) -> Iterator[Pipeline]:
    """``pipeline`` registered inside the block only: a pipeline declared by the tests runs
    as a declared one does (a stored run finds it by its section) without joining the
    algorithms that the registry is checked against."""
    if pipeline.name in _PIPELINES:
        raise ValueError(f"a pipeline named {pipeline.name!r} is already registered")
    _PIPELINES[pipeline.name] = pipeline
    try:
        yield pipeline
    finally:
        del _PIPELINES[pipeline.name]


def registered_pipelines() -> dict[str, Pipeline]:
    """The pipelines registered so far, by name (every declared one once
    :mod:`~nemo_rl_core.pipeline.registry` is imported)."""
    return dict(_PIPELINES)

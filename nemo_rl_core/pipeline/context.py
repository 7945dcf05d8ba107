"""What a stage reads and what it returns: typed references to stored outputs.

A finished stage is known by its :class:`StageRef` (the stored objects, each with its size
and sha256), which is what flows hand from one stage to the next and what the manifest
records. A stage's ``compute`` gets a :class:`StageContext` (the run's warm objects, the
iteration, the refs of the stages it reads) and returns a :class:`StageResult`.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self, TypeVar

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.pipeline.spec import split_round
from nemo_rl_core.storage.run_storage import IntegrityError, ObjectRef

if TYPE_CHECKING:
    from nemo_rl_core.pipeline.runtime import RunRuntime

T = TypeVar("T")
BATCH = "batch"  # the output name of a stage's main batch
PREVIOUS = "previous"  # what a refill round reads of its own previous round


@dataclass(frozen=True)
class StageRef:
    """A finished stage's stored outputs by name."""

    outputs: Mapping[str, ObjectRef]

    def digest(self, name: str = BATCH) -> str:
        return self.outputs[name].sha256

    def digests(self) -> dict[str, str]:
        return {name: ref.sha256 for name, ref in sorted(self.outputs.items())}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: ref.to_dict() for name, ref in self.outputs.items()}

    @classmethod
    def from_dict(cls, outputs: Mapping[str, Mapping[str, Any]]) -> Self:
        return cls({name: ObjectRef.from_dict(dict(ref)) for name, ref in outputs.items()})


@dataclass
class StageResult:
    """What ``compute`` made: outputs (a ``BatchedDataDict`` is stored as a batch, a dict as
    JSON) and metrics recorded in the manifest."""

    outputs: dict[str, BatchedDataDict | dict[str, Any]]
    metrics: dict[str, Any] = field(default_factory=dict)


_STAGE_KEY_RE = re.compile(r"iter_(?P<iteration>\d+)/(?P<stage>[^/]+)/[^/]+")


class DamagedInputError(IntegrityError):
    """A stage input does not match its manifest entry (size, sha256, missing): names the
    object and the stage and iteration that produced it, which the flow re-executes."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(key, detail)
        self.key, self.detail = key, detail
        match = _STAGE_KEY_RE.fullmatch(key)
        if match is None:
            raise ValueError(f"{key!r} is not a stage output key (iter_<n>/<stage>/<name>)")
        self.iteration, self.stage = int(match["iteration"]), match["stage"]

    def __str__(self) -> str:
        return (
            f"input {self.key} (output of stage {self.stage!r} of iteration {self.iteration}) "
            f"is damaged: {self.detail}"
        )


@dataclass(frozen=True)
class StageContext:
    """One stage of one iteration at work: the run's warm objects and its upstream refs."""

    runtime: "RunRuntime"
    iteration: int
    upstream: Mapping[str, StageRef]
    name: str = ""

    @property
    def config(self) -> Any:
        return self.runtime.config

    @property
    def weights_step(self) -> int:
        """The step whose weights this stage reads (``Pipeline.weights_step``)."""
        return self.runtime.pipeline.weights_step(self.config, self.name, self.iteration)

    @property
    def round_index(self) -> int:
        """Which refill round this is (0: the iteration's first, or no refill)."""
        return split_round(self.name)[1]

    def batch(self, stage: str, name: str = BATCH) -> BatchedDataDict:
        """An upstream stage's batch; ``DamagedInputError`` if it no longer matches its entry."""
        return self._read(stage, name, self.runtime.storage.read_batch)

    def json(self, stage: str, name: str) -> dict[str, Any]:
        return self._read(stage, name, self.runtime.storage.read_json)

    def _read(self, stage: str, name: str, read: Callable[[ObjectRef], T]) -> T:
        return read_input(self.upstream[stage].outputs[name], read)


def read_input(ref: ObjectRef, read: Callable[[ObjectRef], T]) -> T:
    """``read(ref)``, with damage reported as the :class:`DamagedInputError` that names the
    stage to re-make."""
    try:
        return read(ref)
    except IntegrityError as err:
        raise DamagedInputError(ref.key, str(err)) from err

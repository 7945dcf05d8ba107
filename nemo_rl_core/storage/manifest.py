"""The records a run keeps of its stages, as typed values: an iteration's manifest
(``iter_<n>/MANIFEST.json``: one :class:`StageEntry` per stage, the :class:`Repair` of
each output found damaged), the entry of a part of a split stage
(``iter_<n>/<stage>/<part>.entry.json``) and the record of a stage running elsewhere
(``stage_runs/...``, a :class:`StageRun`).

Only the storage package reads and writes these files; everyone else gets these values.
``to_dict`` gives back the JSON the files have always held (same keys, same order), and
``from_dict`` reads it, refusing a record that lacks a field, has one too many or has a
status other than ``complete`` and ``stale``.

Frozen dataclasses rather than pydantic models: these are not user input but records this
package writes itself, read on every stage's "is it done?"; ``ObjectRef`` beside them is
one already. Their ``dict`` fields are the records' own copies: read, never change them.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, Self

from nemo_rl_core.storage.object_store import ObjectRef

Status = Literal["complete", "stale"]
COMPLETE: Status = "complete"
STALE: Status = "stale"
_STATUSES = (COMPLETE, STALE)
_RAN_ON = ("pool", "worker", "host", "flow_run")


@dataclass(frozen=True)
class RanOn:
    """Where a stage ran: the work pool, worker, host and flow run (pool, worker and flow
    run are None outside a worker's flow run), and over how many ranks when it ran across
    processes (None: in one)."""

    pool: str | None
    worker: str | None
    host: str | None
    flow_run: str | None
    ranks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        where: dict[str, Any] = {
            "pool": self.pool,
            "worker": self.worker,
            "host": self.host,
            "flow_run": self.flow_run,
        }
        if self.ranks is not None:
            where["ranks"] = self.ranks
        return where

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        fields = _fields(data, "ran_on", _RAN_ON, optional=("ranks",))
        ranks = fields.get("ranks")
        if ranks is not None and (not isinstance(ranks, int) or isinstance(ranks, bool)):
            raise ValueError(f"ranks is {ranks!r}, not an int")
        pool, worker, host, flow_run = (_optional_str(fields[name], name) for name in _RAN_ON)
        return cls(pool, worker, host, flow_run, ranks)


@dataclass(frozen=True)
class StageEntry:
    """A committed stage (or part of one): the inputs that decided it, its stored outputs,
    its metrics, when it finished and where it ran; ``stale`` once marked to be redone."""

    status: Status
    inputs: dict[str, str]
    outputs: dict[str, ObjectRef]
    metrics: dict[str, Any]
    finished_at: datetime
    ran_on: RanOn | None = None

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    def marked_stale(self) -> "StageEntry":
        return replace(self, status=STALE)

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "status": self.status,
            "inputs": dict(self.inputs),
            "outputs": {name: ref.to_dict() for name, ref in self.outputs.items()},
            "metrics": dict(self.metrics),
            "finished_at": self.finished_at.isoformat(),
        }
        if self.ran_on is not None:
            entry["ran_on"] = self.ran_on.to_dict()
        return entry

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        required = ("status", "inputs", "outputs", "metrics", "finished_at")
        fields = _fields(data, "stage entry", required, optional=("ran_on",))
        status = fields["status"]
        if status not in _STATUSES:
            raise ValueError(f"status {status!r} is not one of {list(_STATUSES)}")
        outputs = _mapping(fields["outputs"], "outputs")
        return cls(
            status=status,
            inputs={str(k): str(v) for k, v in _mapping(fields["inputs"], "inputs").items()},
            outputs={name: ObjectRef.from_dict(dict(ref)) for name, ref in outputs.items()},
            metrics=dict(_mapping(fields["metrics"], "metrics")),
            finished_at=datetime.fromisoformat(str(fields["finished_at"])),
            ran_on=None if "ran_on" not in fields else RanOn.from_dict(fields["ran_on"]),
        )


@dataclass(frozen=True)
class Repair:
    """An output found damaged (``damage`` says how) and re-made by its producing stage."""

    key: str
    damage: str
    at: datetime

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "damage": self.damage, "at": self.at.isoformat()}

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        fields = _fields(data, "repair", ("key", "damage", "at"))
        return cls(
            str(fields["key"]), str(fields["damage"]), datetime.fromisoformat(str(fields["at"]))
        )


@dataclass(frozen=True)
class Manifest:
    """An iteration's manifest: its committed stages by name (refill rounds as ``reward.1``)
    and the repairs made in it. A stage without an entry has not finished."""

    stages: dict[str, StageEntry]
    repairs: tuple[Repair, ...] = ()

    def complete(self, stage: str) -> StageEntry | None:
        """The stage's entry if it is complete (not missing, not stale)."""
        entry = self.stages.get(stage)
        return entry if entry is not None and entry.complete else None

    def stale_stages(self) -> list[str]:
        return [name for name, entry in self.stages.items() if not entry.complete]

    def repaired_keys(self) -> set[str]:
        return {repair.key for repair in self.repairs}

    def with_stage(self, stage: str, entry: StageEntry) -> "Manifest":
        return replace(self, stages={**self.stages, stage: entry})

    def with_stale(self, stages: Iterable[str]) -> "Manifest | None":
        """The manifest with these stages' entries marked stale; None if none changes."""
        marked = {
            stage: entry.marked_stale()
            for stage in stages
            if (entry := self.stages.get(stage)) is not None and entry.complete
        }
        return replace(self, stages={**self.stages, **marked}) if marked else None

    def with_repair(self, repair: Repair) -> "Manifest":
        return replace(self, repairs=(*self.repairs, repair))

    def to_dict(self) -> dict[str, Any]:
        manifest: dict[str, Any] = {
            "stages": {name: entry.to_dict() for name, entry in self.stages.items()}
        }
        if self.repairs:
            manifest["repairs"] = [repair.to_dict() for repair in self.repairs]
        return manifest

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        fields = _fields(data, "manifest", ("stages",), optional=("repairs",))
        stages = {}
        for name, entry in _mapping(fields["stages"], "stages").items():
            try:
                stages[str(name)] = StageEntry.from_dict(entry)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"stages.{name}: {exc}") from exc
        repairs = fields.get("repairs", [])
        if not isinstance(repairs, list):
            raise ValueError(f"repairs is {type(repairs).__name__}, not a list")
        return cls(stages, tuple(Repair.from_dict(repair) for repair in repairs))


@dataclass(frozen=True)
class DamagedInput:
    """An input a stage found damaged: the object's key and what was wrong with it."""

    key: str
    detail: str


@dataclass(frozen=True)
class StageRun:
    """A stage running in another process (on another work pool): where it runs, its
    process, how long its heartbeat may stay silent (``ttl_s``), its beat count, and the
    damaged input it found, if it found one."""

    ran_on: RanOn
    pid: int
    ttl_s: float
    beat: int = 0
    damaged: DamagedInput | None = None

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            **self.ran_on.to_dict(),
            "pid": self.pid,
            "ttl_s": self.ttl_s,
            "beat": self.beat,
        }
        if self.damaged is not None:
            record["damaged"] = {"key": self.damaged.key, "detail": self.damaged.detail}
        return record

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        fields = _fields(
            data, "stage run", (*_RAN_ON, "pid", "ttl_s", "beat"), optional=("ranks", "damaged")
        )
        damaged = fields.get("damaged")
        where = (*_RAN_ON, "ranks")
        return cls(
            ran_on=RanOn.from_dict({name: fields[name] for name in where if name in fields}),
            pid=int(fields["pid"]),
            ttl_s=float(fields["ttl_s"]),
            beat=int(fields["beat"]),
            damaged=None
            if damaged is None
            else DamagedInput(**_fields(damaged, "damaged", ("key", "detail"))),
        )


def _fields(
    data: Any, kind: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``data`` as a JSON object with every ``required`` key and no key but those and the
    ``optional`` ones; ``ValueError`` naming what is missing or unknown."""
    if not isinstance(data, dict):
        raise ValueError(f"a {kind} must be a JSON object, not {type(data).__name__}")
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"{kind} {sorted(data)} lacks {missing}")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise ValueError(f"{kind} has unknown keys {unknown}")
    return data


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} is {type(value).__name__}, not a JSON object")
    return value


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} is {value!r}, not a string or null")
    return value

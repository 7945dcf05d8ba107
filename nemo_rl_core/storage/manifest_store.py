"""The manifests of a run: which stages of an iteration are done, with which inputs and
outputs, and the records of parts and of stages running elsewhere (their heartbeats, the
rendezvous notes of stages across machines); read and written as the typed records of
``manifest.py``, stored as the JSON they have always been.

A stage is done only when its entry is in ``iter_<n>/MANIFEST.json`` (written whole, after
its outputs). Inside one process manifest updates are serialised by a lock; on S3 each is
written on condition of the version (ETag) this process last read or wrote, so a stage
committed meanwhile by another process is never lost.
"""

import json
import posixpath
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, Self, TypeVar

from nemo_rl_core.storage.layout import (
    ITER_RE,
    PART_SUFFIX,
    STAGE_RUNS,
    iter_dir,
    manifest_key,
    numbered,
    stage_key,
)
from nemo_rl_core.storage.lease import S3Object, VersionConflict, Versioned
from nemo_rl_core.storage.manifest import (
    COMPLETE,
    Manifest,
    RanOn,
    Repair,
    StageEntry,
    StageRun,
)
from nemo_rl_core.storage.names import validate_name
from nemo_rl_core.storage.object_store import IntegrityError, ObjectRef, ObjectStore, json_bytes
from nemo_rl_core.storage.outage import StorageError

_MANIFEST_LOCK = threading.Lock()
_MANIFEST_RACES = 8  # conditional manifest updates tried before giving up
_MANIFESTS_REMEMBERED = 8  # iterations whose manifest version a ManifestStore keeps
_UNSEEN: Any = object()  # no manifest version remembered (None: there is no manifest)


class _Record(Protocol):
    @classmethod
    def from_dict(cls, data: Any) -> Self: ...


R = TypeVar("R", bound=_Record)


class ManifestStore:
    """Reads and commits the manifests of one run's iterations, in its ``ObjectStore``."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        # On S3: each iteration's manifest as this process last read or wrote it, with its
        # ETag; the base of the next conditional update (see ``_update_manifest``).
        self._manifest_seen: dict[int, Versioned | None] = {}
        # On S3: the iterations from this one on had no directory at this process's last
        # listing and have not been seen since: their manifest is known absent, no GET.
        self._unlisted_from: int | None = None

    def read_manifest(self, iteration: int) -> Manifest:
        """An iteration's manifest; without stages when none was recorded."""
        if self.objects.s3:
            seen = self._read_manifest_version(iteration)
            data = None if seen is None else seen.data
        else:
            data = self.objects.get_optional(manifest_key(iteration))
        return self._parse_manifest(iteration, data)

    def _read_manifest_version(self, iteration: int) -> Versioned | None:
        """The manifest's bytes and ETag from one GET (S3), remembered as the base of this
        process's next conditional update."""
        key = manifest_key(iteration)
        seen = self.objects.call(
            "read", key, S3Object(self.objects.fs, self.objects.path(key)).read
        )
        self._remember_manifest(iteration, seen)
        return seen

    def _known_manifest(self, iteration: int) -> Versioned | None:
        """The manifest as this process last read or wrote it (S3), read if it has none.

        An iteration past the last listing (``iterations``) has none: the run's driver
        lists its iterations when it plans them, and the lease keeps other drivers out.
        A stage of it committed meanwhile by another process (a placed stage) is the case
        ``completed_stage`` describes: the conditional commit fails and reads it."""
        seen = self._manifest_seen.get(iteration, _UNSEEN)
        if seen is not _UNSEEN:
            return seen
        if self._unlisted_from is not None and iteration >= self._unlisted_from:
            self._remember_manifest(iteration, None)
            return None
        return self._read_manifest_version(iteration)

    def _parse_manifest(self, iteration: int, data: bytes | None) -> Manifest:
        if data is None:
            return Manifest({})
        return _parsed(Manifest, data, self.objects.url(manifest_key(iteration)))

    def record_stage(
        self,
        iteration: int,
        stage: str,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None = None,
        ran_on: RanOn | None = None,
    ) -> StageEntry:
        """Commit a finished stage: its entry goes into ``MANIFEST.json`` (read-modify-write);
        ``ran_on`` says where it ran (work pool, worker, host, flow run)."""
        validate_name("stage", stage)
        entry = self._entry(inputs, outputs, metrics, ran_on)
        self._update_manifest(iteration, lambda manifest: manifest.with_stage(stage, entry))
        return entry

    def completed_stage(
        self, iteration: int, stage: str, inputs: dict[str, str]
    ) -> StageEntry | None:
        """The stage's entry if complete, not stale, with these inputs and intact outputs.

        Every output is read back and checked against its sha256: a damaged or truncated
        object makes the stage count as not done, so it is recomputed instead of trusted.

        On S3 the manifest is the version this process last read or wrote, when it has one:
        the stages of an iteration ask in turn, each after the previous one's commit. If
        another process changed it since, a stage done there counts as not done here; it is
        computed again (to the same bytes) and its commit, conditional on that version,
        fails, reads the newer manifest and is made again on it."""
        validate_name("stage", stage)
        if self.objects.s3:
            seen = self._known_manifest(iteration)
            manifest = self._parse_manifest(iteration, None if seen is None else seen.data)
        else:
            manifest = self.read_manifest(iteration)
        return self._if_complete(manifest.stages.get(stage), inputs)

    def record_part(
        self,
        iteration: int,
        stage: str,
        part: str,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None = None,
        ran_on: RanOn | None = None,
    ) -> StageEntry:
        """Commit one part of a stage whose work is split (fan-out) in an entry object of
        its own, ``iter_<n>/<stage>/<part>.entry.json``: parts finish concurrently, possibly
        in other processes, so they never rewrite the manifest."""
        entry = self._entry(inputs, outputs, metrics, ran_on)
        self.objects.put(self._part_key(iteration, stage, part), _part_bytes(entry))
        return entry

    def completed_part(
        self, iteration: int, stage: str, part: str, inputs: dict[str, str]
    ) -> StageEntry | None:
        """The part's entry if complete with these inputs and intact outputs (as a stage's)."""
        key = self._part_key(iteration, stage, part)
        data = self.objects.get_optional(key)
        entry = None if data is None else _parsed(StageEntry, data, self.objects.url(key))
        return self._if_complete(entry, inputs)

    def _part_key(self, iteration: int, stage: str, part: str) -> str:
        return stage_key(iteration, stage, f"{validate_name('part', part)}{PART_SUFFIX}")

    def _entry(
        self,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None,
        ran_on: RanOn | None = None,
    ) -> StageEntry:
        for ref in outputs.values():
            self.objects.check_key(ref.key)
        return StageEntry(
            status=COMPLETE,
            inputs=dict(inputs),
            outputs=dict(outputs),
            metrics=dict(metrics or {}),
            finished_at=datetime.now(UTC),
            ran_on=ran_on,
        )

    def _if_complete(self, entry: StageEntry | None, inputs: dict[str, str]) -> StageEntry | None:
        if entry is None or not entry.complete or entry.inputs != inputs:
            return None
        for ref in entry.outputs.values():
            try:
                self.objects.get_verified(ref, lambda data: None, mapped=True)
            except IntegrityError:
                return None
        return entry

    def mark_stale(self, iteration: int, stages: list[str]) -> None:
        """Mark stages to be redone (e.g. everything downstream of a rerun stage), and the
        parts of each, so that a rerun stage computes its parts again too."""
        for stage in stages:
            validate_name("stage", stage)
        self._update_manifest(iteration, lambda manifest: manifest.with_stale(stages))
        for stage in stages:
            self._mark_parts_stale(iteration, stage)

    def _mark_parts_stale(self, iteration: int, stage: str) -> None:
        folder = f"{iter_dir(iteration)}/{stage}"
        for name in self.objects.list_names(folder):
            if name.endswith(PART_SUFFIX):
                key = f"{folder}/{name}"
                data = self.objects.get_optional(key)
                if data is None:  # gone since the listing
                    continue
                entry = _parsed(StageEntry, data, self.objects.url(key))
                if entry.complete:
                    self.objects.put(key, _part_bytes(entry.marked_stale()))

    def record_repair(self, iteration: int, key: str, damage: str) -> None:
        """Note in the iteration's manifest that ``key`` was found damaged (``damage`` says how)
        and its producing stage re-made it."""
        repair = Repair(key, damage, datetime.now(UTC))
        self._update_manifest(iteration, lambda manifest: manifest.with_repair(repair))

    def recorded_entries(self, iteration: int) -> list[tuple[str, StageEntry]]:
        """Every entry recorded for the iteration, complete or stale, by label: its
        manifest's stages (``reward``, a refill round ``reward.1``), then the parts recorded
        beside them (``generate/shard-0-of-2``), found by one listing. ``IntegrityError``
        names a manifest or part entry that cannot be read."""
        entries = list(self.read_manifest(iteration).stages.items())
        folder = self.objects.path(iter_dir(iteration))
        for path in sorted(self.objects.find(iter_dir(iteration))):
            if str(path).endswith(PART_SUFFIX):
                relative = posixpath.relpath(str(path), folder)
                key = f"{iter_dir(iteration)}/{relative}"
                data = self.objects.get_optional(key)
                if data is not None:  # gone since the listing: a stage re-made meanwhile
                    entry = _parsed(StageEntry, data, self.objects.url(key))
                    entries.append((relative.removesuffix(PART_SUFFIX), entry))
        return entries

    def iterations(self) -> list[int]:
        """Iterations that have a directory (any stage output or manifest)."""
        listed = sorted(numbered(self.objects.list_names(""), ITER_RE))
        if self.objects.s3:
            seen = [i for i, known in self._manifest_seen.items() if known is not None]
            self._unlisted_from = max([*listed, *seen], default=-1) + 1
        return listed

    def forget(self) -> None:
        """Read every manifest from the store again (see ``RunStorage.forget_writes``)."""
        with _MANIFEST_LOCK:
            self._manifest_seen.clear()
            self._unlisted_from = None

    def _remember_manifest(self, iteration: int, seen: Versioned | None) -> None:
        """Keep the manifests of the newest iterations only: a long run's older ones are
        rarely written again, and one that is just costs a read first. A remembered
        iteration is no longer known absent by the listing: once forgotten, it is read."""
        if self._unlisted_from is not None and iteration >= self._unlisted_from:
            self._unlisted_from = iteration + 1
        self._manifest_seen[iteration] = seen
        for old in sorted(self._manifest_seen)[:-_MANIFESTS_REMEMBERED]:
            self._manifest_seen.pop(old, None)  # another thread may have dropped it

    def _update_manifest(
        self, iteration: int, change: Callable[[Manifest], Manifest | None]
    ) -> None:
        """Write the manifest ``change`` makes of the iteration's, unless it returns None.

        Threads of this process take turns (a lock). On S3 the write is conditional on the
        version this process last read or wrote, so a commit needs no GET first; a manifest
        that changed meanwhile (another process's stage) fails the condition, is read again
        and changed again."""
        key = manifest_key(iteration)
        with _MANIFEST_LOCK:
            if not self.objects.s3:
                changed = change(self.read_manifest(iteration))
                if changed is not None:
                    self.objects.put(key, json_bytes(changed.to_dict()))
                return
            target = S3Object(self.objects.fs, self.objects.path(key))
            for _ in range(_MANIFEST_RACES):
                base = self._known_manifest(iteration)
                manifest = self._parse_manifest(iteration, None if base is None else base.data)
                changed = change(manifest)
                if changed is None:
                    return
                data = json_bytes(changed.to_dict())
                try:
                    if base is None:
                        create = partial(target.create, data)
                        version = self.objects.call("write", key, create, reading=False)
                    else:
                        write = partial(target.replace, data, base.version)
                        version = self.objects.call("write", key, write, reading=False)
                except VersionConflict:  # changed since this process saw it: read it again
                    self._manifest_seen.pop(iteration, None)
                    continue
                self._remember_manifest(iteration, Versioned(data, version))
                return
        raise StorageError(
            f"{self.objects.url(key)} kept changing under {_MANIFEST_RACES} conditional updates"
        )

    # ---- stages running elsewhere ----------------------------------------------------

    def write_stage_run(self, iteration: int, stage: str, record: StageRun) -> None:
        """Record (and renew) a stage running in another process, e.g. on another work
        pool: who runs it and until when it promises to write this again (its heartbeat)."""
        key = self._stage_run_key(iteration, stage)
        self.objects.put(key, json.dumps(record.to_dict()).encode())

    def read_stage_run(self, iteration: int, stage: str) -> StageRun | None:
        """The newest :meth:`write_stage_run` record of a stage, or None."""
        key = self._stage_run_key(iteration, stage)
        data = self.objects.get_optional(key)
        return None if data is None else _parsed(StageRun, data, self.objects.url(key))

    def _stage_run_key(self, iteration: int, stage: str) -> str:
        return f"{STAGE_RUNS}/{iter_dir(iteration)}.{validate_name('stage', stage)}.json"

    def write_rendezvous_note(
        self, iteration: int, stage: str, attempt: str, note: str, record: dict
    ) -> None:
        """A note of one attempt of a stage whose ranks span several machines (where node 0
        hosts the rendezvous, which nodes joined); the nodes read each other's."""
        key = self._rendezvous_key(iteration, stage, attempt, note)
        self.objects.put(key, json.dumps(record).encode())

    def read_rendezvous_note(
        self, iteration: int, stage: str, attempt: str, note: str
    ) -> dict | None:
        data = self.objects.get_optional(self._rendezvous_key(iteration, stage, attempt, note))
        return None if data is None else json.loads(data)

    def _rendezvous_key(self, iteration: int, stage: str, attempt: str, note: str) -> str:
        names = (validate_name("stage", stage), validate_name("attempt", attempt))
        note = validate_name("note", note)
        return f"{STAGE_RUNS}/{iter_dir(iteration)}.{names[0]}.rdzv-{names[1]}.{note}.json"


def _part_bytes(entry: StageEntry) -> bytes:
    """A part's entry as it is stored: compact JSON, in the entry's own key order."""
    return json.dumps(entry.to_dict()).encode()


def _parsed(record: type[R], data: bytes, url: str) -> R:
    """``data`` read as a ``record``; ``IntegrityError`` naming the object and what is wrong."""
    try:
        return record.from_dict(json.loads(data))
    except (ValueError, TypeError) as exc:  # json's JSONDecodeError is a ValueError
        raise IntegrityError(f"{url} is not a valid {record.__name__}: {exc}") from exc

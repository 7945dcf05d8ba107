"""The manifests of a run: which stages of an iteration are done, with which inputs and
outputs, and the records of parts and of stages running elsewhere.

A stage is done only when its entry is in ``iter_<n>/MANIFEST.json`` (written whole, after
its outputs). Inside one process manifest updates are serialised by a lock; on S3 each is
written on condition of the version (ETag) this process last read or wrote, so a stage
committed meanwhile by another process is never lost.
"""

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

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
from nemo_rl_core.storage.names import validate_name
from nemo_rl_core.storage.object_store import IntegrityError, ObjectRef, ObjectStore, json_bytes
from nemo_rl_core.storage.outage import StorageError

_MANIFEST_LOCK = threading.Lock()
_MANIFEST_RACES = 8  # conditional manifest updates tried before giving up
_MANIFESTS_REMEMBERED = 8  # iterations whose manifest version a ManifestStore keeps
_UNSEEN: Any = object()  # no manifest version remembered (None: there is no manifest)


class ManifestStore:
    """Reads and commits the manifests of one run's iterations, in its ``ObjectStore``."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        # On S3: each iteration's manifest as this process last read or wrote it, with its
        # ETag; the base of the next conditional update (see ``_update_manifest``).
        self._manifest_seen: dict[int, Versioned | None] = {}

    def read_manifest(self, iteration: int) -> dict:
        """``{"stages": {stage: entry}}`` of an iteration; empty when none was recorded."""
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
        seen = self.objects.call(key, S3Object(self.objects.fs, self.objects.path(key)).read)
        self._remember_manifest(iteration, seen)
        return seen

    def _known_manifest(self, iteration: int) -> Versioned | None:
        """The manifest as this process last read or wrote it (S3), read if it has none."""
        seen = self._manifest_seen.get(iteration, _UNSEEN)
        return self._read_manifest_version(iteration) if seen is _UNSEEN else seen

    def _parse_manifest(self, iteration: int, data: bytes | None) -> dict:
        key = manifest_key(iteration)
        if data is None:
            return {"stages": {}}
        try:
            manifest = json.loads(data)
        except ValueError as exc:
            raise IntegrityError(f"{self.objects.url(key)} is not valid JSON: {exc}") from exc
        if not isinstance(manifest, dict) or not isinstance(manifest.get("stages"), dict):
            raise IntegrityError(f"{self.objects.url(key)} has no 'stages' mapping")
        return manifest

    def record_stage(
        self,
        iteration: int,
        stage: str,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None = None,
        ran_on: dict | None = None,
    ) -> dict:
        """Commit a finished stage: its entry goes into ``MANIFEST.json`` (read-modify-write);
        ``ran_on`` says where it ran (work pool, worker, host)."""
        validate_name("stage", stage)
        entry = self._entry(inputs, outputs, metrics, ran_on)

        def add(manifest: dict) -> bool:
            manifest["stages"][stage] = entry
            return True

        self._update_manifest(iteration, add)
        return entry

    def completed_stage(self, iteration: int, stage: str, inputs: dict[str, str]) -> dict | None:
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
        return self._if_complete(manifest["stages"].get(stage), inputs)

    def record_part(
        self,
        iteration: int,
        stage: str,
        part: str,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None = None,
        ran_on: dict | None = None,
    ) -> dict:
        """Commit one part of a stage whose work is split (fan-out) in an entry object of
        its own, ``iter_<n>/<stage>/<part>.entry.json``: parts finish concurrently, possibly
        in other processes, so they never rewrite the manifest."""
        entry = self._entry(inputs, outputs, metrics, ran_on)
        self.objects.put(self._part_key(iteration, stage, part), json.dumps(entry).encode())
        return entry

    def completed_part(
        self, iteration: int, stage: str, part: str, inputs: dict[str, str]
    ) -> dict | None:
        """The part's entry if complete with these inputs and intact outputs (as a stage's)."""
        data = self.objects.get_optional(self._part_key(iteration, stage, part))
        return self._if_complete(None if data is None else json.loads(data), inputs)

    def _part_key(self, iteration: int, stage: str, part: str) -> str:
        return stage_key(iteration, stage, f"{validate_name('part', part)}{PART_SUFFIX}")

    def _entry(
        self,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None,
        ran_on: dict | None = None,
    ) -> dict:
        for ref in outputs.values():
            self.objects.check_key(ref.key)
        entry = {
            "status": "complete",
            "inputs": dict(inputs),
            "outputs": {name: ref.to_dict() for name, ref in outputs.items()},
            "metrics": dict(metrics or {}),
            "finished_at": datetime.now(UTC).isoformat(),
        }
        if ran_on is not None:
            entry["ran_on"] = dict(ran_on)
        return entry

    def _if_complete(self, entry: dict | None, inputs: dict[str, str]) -> dict | None:
        if entry is None or entry.get("status") != "complete" or entry.get("inputs") != inputs:
            return None
        for ref in entry.get("outputs", {}).values():
            try:
                self.objects.get_verified(ObjectRef.from_dict(ref), lambda data: None, mapped=True)
            except IntegrityError:
                return None
        return entry

    def mark_stale(self, iteration: int, stages: list[str]) -> None:
        """Mark stages to be redone (e.g. everything downstream of a rerun stage), and the
        parts of each, so that a rerun stage computes its parts again too."""

        def mark(manifest: dict) -> bool:
            changed = False
            for stage in stages:
                entry = manifest["stages"].get(validate_name("stage", stage))
                if entry is not None and entry.get("status") != "stale":
                    entry["status"] = "stale"
                    changed = True
            return changed

        self._update_manifest(iteration, mark)
        for stage in stages:
            self._mark_parts_stale(iteration, stage)

    def _mark_parts_stale(self, iteration: int, stage: str) -> None:
        folder = f"{iter_dir(iteration)}/{stage}"
        for name in self.objects.list_names(folder):
            if name.endswith(PART_SUFFIX):
                key = f"{folder}/{name}"
                entry = json.loads(self.objects.get_optional(key) or "{}")
                if entry.get("status", "stale") != "stale":
                    self.objects.put(key, json.dumps({**entry, "status": "stale"}).encode())

    def record_repair(self, iteration: int, key: str, damage: str) -> None:
        """Note in the iteration's manifest that ``key`` was found damaged (``damage`` says how)
        and its producing stage re-made it."""
        repair = {"key": key, "damage": damage, "at": datetime.now(UTC).isoformat()}

        def note(manifest: dict) -> bool:
            manifest.setdefault("repairs", []).append(repair)
            return True

        self._update_manifest(iteration, note)

    def iterations(self) -> list[int]:
        """Iterations that have a directory (any stage output or manifest)."""
        return sorted(numbered(self.objects.list_names(""), ITER_RE))

    def forget(self) -> None:
        """Read every manifest from the store again (see ``RunStorage.forget_writes``)."""
        with _MANIFEST_LOCK:
            self._manifest_seen.clear()

    def _remember_manifest(self, iteration: int, seen: Versioned | None) -> None:
        """Keep the manifests of the newest iterations only: a long run's older ones are
        rarely written again, and one that is just costs a read first."""
        self._manifest_seen[iteration] = seen
        for old in sorted(self._manifest_seen)[:-_MANIFESTS_REMEMBERED]:
            self._manifest_seen.pop(old, None)  # another thread may have dropped it

    def _update_manifest(self, iteration: int, change: Callable[[dict], bool]) -> None:
        """Apply ``change`` to the iteration's manifest and write it, unless it returns False.

        Threads of this process take turns (a lock). On S3 the write is conditional on the
        version this process last read or wrote, so a commit needs no GET first; a manifest
        that changed meanwhile (another process's stage) fails the condition, is read again
        and changed again."""
        key = manifest_key(iteration)
        with _MANIFEST_LOCK:
            if not self.objects.s3:
                manifest = self.read_manifest(iteration)
                if change(manifest):
                    self.objects.put(key, json_bytes(manifest))
                return
            target = S3Object(self.objects.fs, self.objects.path(key))
            for _ in range(_MANIFEST_RACES):
                base = self._known_manifest(iteration)
                manifest = self._parse_manifest(iteration, None if base is None else base.data)
                if not change(manifest):
                    return
                data = json_bytes(manifest)
                try:
                    if base is None:
                        version = self.objects.call(
                            key, partial(target.create, data), reading=False
                        )
                    else:
                        write = partial(target.replace, data, base.version)
                        version = self.objects.call(key, write, reading=False)
                except VersionConflict:  # changed since this process saw it: read it again
                    self._manifest_seen.pop(iteration, None)
                    continue
                self._remember_manifest(iteration, Versioned(data, version))
                return
        raise StorageError(
            f"{self.objects.url(key)} kept changing under {_MANIFEST_RACES} conditional updates"
        )

    # ---- stages running elsewhere ----------------------------------------------------

    def write_stage_run(self, iteration: int, stage: str, record: dict) -> None:
        """Record (and renew) a stage running in another process, e.g. on another work
        pool: who runs it and until when it promises to write this again (its heartbeat)."""
        self.objects.put(self._stage_run_key(iteration, stage), json.dumps(record).encode())

    def read_stage_run(self, iteration: int, stage: str) -> dict | None:
        """The newest :meth:`write_stage_run` record of a stage, or None."""
        data = self.objects.get_optional(self._stage_run_key(iteration, stage))
        return None if data is None else json.loads(data)

    def _stage_run_key(self, iteration: int, stage: str) -> str:
        return f"{STAGE_RUNS}/{iter_dir(iteration)}.{validate_name('stage', stage)}.json"

"""Run storage: the one module that knows the layout of a run on object storage.

```
<root>/runs/<run_id>/
  config.yaml                          resolved config, written once
  LEASE.json                           who drives the run, until when
  iter_000003/<stage>/<name>.arrow     stage outputs (BatchedDataDict, codec format;
                                       <name>.parquet with batch_format="parquet")
  iter_000003/<stage>/<name>.json      small outputs (metrics)
  iter_000003/MANIFEST.json            one entry per finished stage: inputs, outputs, checksums,
                                       and the pool, worker and host that ran it
  stage_runs/iter_000003.train.json    a stage running on another machine: its heartbeat
  checkpoints/step_000003/...          checkpoint files, training_info.json, COMMITTED last
```

Commit protocol. Every object is written whole and becomes visible at once: on a local
disk through a temporary file renamed over the key; on S3 (and other object stores) a
PUT, single or multipart, is atomic by itself, so it is written to its key directly. A
stage is done only when its entry is in ``MANIFEST.json`` (written the same way, after
its outputs), so a stage interrupted before that leaves no entry and the previous
manifest untouched; its partial outputs, if any, are never referenced. Checkpoints
count only once their ``COMMITTED`` marker, written after every other file (and deleted
before them), exists.

Concurrent writers of one run are excluded by the lease (``acquire_lease``); inside one
process manifest updates are serialised by a lock. Credentials in ``storage_options``
are handed to fsspec and never logged, stored or put in an error message.
"""

import contextlib
import hashlib
import json
import math
import mmap
import posixpath
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Self, TypeVar

import fsspec
import yaml
from fsspec.implementations.local import LocalFileSystem

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.codec import batch_from_bytes, batch_to_bytes
from nemo_rl_core.storage.containers import ARROW, SUFFIXES, BatchFormat, check_format, map_file
from nemo_rl_core.storage.lease import (
    LEASE_KEY,
    ConditionalObject,
    Lease,
    LocalObject,
    S3Object,
    VersionConflict,
    Versioned,
)
from nemo_rl_core.storage.names import validate_name
from nemo_rl_core.storage.outage import (
    S3_FAST_FAIL,
    S3_TRIES,
    StorageError,
    StorageUnreachableError,
    retry_within_budget,
)
from nemo_rl_core.storage.recent_writes import RecentWrites

T = TypeVar("T")

_ITER_RE = re.compile(r"^iter_(\d+)$")
_STEP_RE = re.compile(r"^step_(\d+)$")
_STAGING_PREFIX = ".staging-"
COMMITTED = "COMMITTED"
TRAINING_INFO = "training_info.json"
MANIFEST = "MANIFEST.json"
STAGE_RUNS = "stage_runs"  # heartbeats of stages running in other processes
_MANIFEST_LOCK = threading.Lock()
_MANIFEST_RACES = 8  # conditional manifest updates tried before giving up
_MANIFESTS_REMEMBERED = 8  # iterations whose manifest version a RunStorage keeps
_UNSEEN: Any = object()  # no manifest version remembered (None: there is no manifest)
_PART_SUFFIX = ".entry.json"  # a part's own entry, beside its outputs
_RECENT_WRITE_BYTES = 256 << 20  # stage outputs kept for the next stages (object stores)
# sha256 releases the GIL on large buffers: hashing runs beside the transfer or decode.
_HASHER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="run-storage-sha256")

try:  # s3fs raises botocore's errors for connection trouble; other backends only OSError
    from botocore.exceptions import BotoCoreError, ClientError

    _TRANSIENT: tuple[type[BaseException], ...] = (OSError, BotoCoreError, ClientError)
except ImportError:  # pragma: no cover - botocore comes with s3fs
    _TRANSIENT = (OSError,)


class IntegrityError(StorageError):
    """An object does not match its manifest entry (size or sha256) or is corrupt."""


class ConfigConflictError(ValueError):
    """The run already has a different config; names the keys that differ."""


@dataclass(frozen=True)
class ObjectRef:
    """A stored object: its key relative to the run, its size in bytes and its sha256."""

    key: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        missing = {"key", "size", "sha256"} - set(data)
        if missing:
            raise ValueError(f"ObjectRef dict {data!r} lacks {sorted(missing)}")
        return cls(key=str(data["key"]), size=int(data["size"]), sha256=str(data["sha256"]))


class RunStorage:
    """Reads and writes one run's config, stage outputs, manifests, checkpoints and lease.

    ``batch_format`` is the container of stage outputs: ``"arrow"`` (Arrow IPC, read
    zero-copy; the default) or ``"parquet"`` (for runs whose outputs other tools read).
    Reads take either, so a run can switch, and outputs of older runs stay readable.
    """

    def __init__(
        self,
        root: str,
        run_id: str,
        storage_options: dict | None = None,
        batch_format: BatchFormat = ARROW,
    ) -> None:
        self.run_id = validate_name("run id", run_id)
        self.batch_format = check_format(batch_format)
        self.root = str(root).rstrip("/") or "/"
        options = dict(storage_options or {})
        protocol = fsspec.utils.get_protocol(self.root)
        if protocol not in ("file", "local"):
            # Other writers (stages in other processes) change the run: never trust a listing.
            options.setdefault("use_listings_cache", False)
        if protocol in ("s3", "s3a"):
            for name, value in S3_FAST_FAIL.items():
                options.setdefault(name, value)
        try:
            self.fs, root_path = fsspec.core.url_to_fs(self.root, **options)
        except (ValueError, ImportError, TypeError) as exc:
            raise StorageError(f"cannot open storage root {self.root!r}: {exc}") from exc
        self._s3 = protocol in ("s3", "s3a")
        if self._s3:
            self.fs.retries = S3_TRIES
        self._local = isinstance(self.fs, LocalFileSystem)
        self._run_path = posixpath.join(root_path.rstrip("/"), "runs", self.run_id)
        self.run_url = f"{self.root}/runs/{self.run_id}"
        self.lease: Lease | None = None
        # On S3: each iteration's manifest as this process last read or wrote it, with its
        # ETag; the base of the next conditional update (see ``_update_manifest``).
        self._manifest_seen: dict[int, Versioned | None] = {}
        self._recent = RecentWrites(0 if self._local else _RECENT_WRITE_BYTES)

    def __repr__(self) -> str:
        return f"RunStorage({self.run_url!r})"

    # ---- config ----------------------------------------------------------------------

    def write_run_config(self, config: dict, allow_change: bool = False) -> ObjectRef:
        """Write ``config.yaml`` once; a different existing config needs ``allow_change``."""
        self._check_lease()
        existing = self.read_run_config()
        if existing is not None and existing != config and not allow_change:
            changed = sorted(_diff_keys(existing, config))
            raise ConfigConflictError(
                f"{self.run_url}/config.yaml holds a different config (keys {changed}); "
                f"use a new run id, or pass allow_change=True to replace it"
            )
        data = yaml.safe_dump(config, sort_keys=False).encode()
        return self._put("config.yaml", data)

    def read_run_config(self) -> dict | None:
        data = self._get_optional("config.yaml")
        return None if data is None else yaml.safe_load(data)

    # ---- stage outputs ---------------------------------------------------------------

    def write_batch(
        self, iteration: int, stage: str, batch: BatchedDataDict, name: str = "batch"
    ) -> ObjectRef:
        """Store a batch at ``iter_<n>/<stage>/<name>.arrow`` (or ``.parquet``), atomically."""
        filename = validate_name("name", name) + SUFFIXES[self.batch_format]
        key = self._stage_key(iteration, stage, filename)
        return self._put(key, batch_to_bytes(batch, format=self.batch_format), remember=True)

    def read_batch(self, ref: ObjectRef) -> BatchedDataDict:
        """Read a stored batch of either container; its size and sha256 must match ``ref``
        (else IntegrityError). Tensors may view the object's (copy-on-write) memory map."""
        source = self._url(ref.key)
        # sha256 covers every byte, so Parquet's page CRCs need not be checked again.
        return self._get_verified(
            ref,
            lambda data: batch_from_bytes(data, source=source, verify_checksums=False),
            mapped=True,
            recent=True,
        )

    def write_json(self, iteration: int, stage: str, name: str, obj: dict) -> ObjectRef:
        key = self._stage_key(iteration, stage, f"{validate_name('name', name)}.json")
        return self._put(key, _json_bytes(obj), remember=True)

    def read_json(self, ref: ObjectRef) -> dict:
        try:
            return self._get_verified(ref, json.loads, recent=True)
        except ValueError as exc:
            raise IntegrityError(f"{self._url(ref.key)} is not valid JSON: {exc}") from exc

    # ---- manifest --------------------------------------------------------------------

    def read_manifest(self, iteration: int) -> dict:
        """``{"stages": {stage: entry}}`` of an iteration; empty when none was recorded."""
        if self._s3:
            seen = self._read_manifest_version(iteration)
            data = None if seen is None else seen.data
        else:
            data = self._get_optional(f"{_iter_dir(iteration)}/{MANIFEST}")
        return self._parse_manifest(iteration, data)

    def _read_manifest_version(self, iteration: int) -> Versioned | None:
        """The manifest's bytes and ETag from one GET (S3), remembered as the base of this
        process's next conditional update."""
        key = f"{_iter_dir(iteration)}/{MANIFEST}"
        seen = self._call(key, S3Object(self.fs, self._path(key)).read)
        self._remember_manifest(iteration, seen)
        return seen

    def _known_manifest(self, iteration: int) -> Versioned | None:
        """The manifest as this process last read or wrote it (S3), read if it has none."""
        seen = self._manifest_seen.get(iteration, _UNSEEN)
        return self._read_manifest_version(iteration) if seen is _UNSEEN else seen

    def _parse_manifest(self, iteration: int, data: bytes | None) -> dict:
        key = f"{_iter_dir(iteration)}/{MANIFEST}"
        if data is None:
            return {"stages": {}}
        try:
            manifest = json.loads(data)
        except ValueError as exc:
            raise IntegrityError(f"{self._url(key)} is not valid JSON: {exc}") from exc
        if not isinstance(manifest, dict) or not isinstance(manifest.get("stages"), dict):
            raise IntegrityError(f"{self._url(key)} has no 'stages' mapping")
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
        self._check_lease()
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
        if self._s3:
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
        self._check_lease()
        entry = self._entry(inputs, outputs, metrics, ran_on)
        self._put(self._part_key(iteration, stage, part), json.dumps(entry).encode())
        return entry

    def completed_part(
        self, iteration: int, stage: str, part: str, inputs: dict[str, str]
    ) -> dict | None:
        """The part's entry if complete with these inputs and intact outputs (as a stage's)."""
        data = self._get_optional(self._part_key(iteration, stage, part))
        return self._if_complete(None if data is None else json.loads(data), inputs)

    def _part_key(self, iteration: int, stage: str, part: str) -> str:
        return self._stage_key(iteration, stage, f"{validate_name('part', part)}{_PART_SUFFIX}")

    def _entry(
        self,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None,
        ran_on: dict | None = None,
    ) -> dict:
        for ref in outputs.values():
            self._check_key(ref.key)
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
                self._get_verified(ObjectRef.from_dict(ref), lambda data: None, mapped=True)
            except IntegrityError:
                return None
        return entry

    def mark_stale(self, iteration: int, stages: list[str]) -> None:
        """Mark stages to be redone (e.g. everything downstream of a rerun stage), and the
        parts of each, so that a rerun stage computes its parts again too."""
        self._check_lease()

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
        folder = f"{_iter_dir(iteration)}/{stage}"
        for name in self._list_names(folder):
            if name.endswith(_PART_SUFFIX):
                key = f"{folder}/{name}"
                entry = json.loads(self._get_optional(key) or "{}")
                if entry.get("status", "stale") != "stale":
                    self._put(key, json.dumps({**entry, "status": "stale"}).encode())

    def record_repair(self, iteration: int, key: str, damage: str) -> None:
        """Note in the iteration's manifest that ``key`` was found damaged (``damage`` says how)
        and its producing stage re-made it."""
        self._check_lease()
        repair = {"key": key, "damage": damage, "at": datetime.now(UTC).isoformat()}

        def note(manifest: dict) -> bool:
            manifest.setdefault("repairs", []).append(repair)
            return True

        self._update_manifest(iteration, note)

    def iterations(self) -> list[int]:
        """Iterations that have a directory (any stage output or manifest)."""
        return sorted(_numbered(self._list_names(""), _ITER_RE))

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
        key = f"{_iter_dir(iteration)}/{MANIFEST}"
        with _MANIFEST_LOCK:
            if not self._s3:
                manifest = self.read_manifest(iteration)
                if change(manifest):
                    self._put(key, _json_bytes(manifest))
                return
            target = S3Object(self.fs, self._path(key))
            for _ in range(_MANIFEST_RACES):
                base = self._known_manifest(iteration)
                manifest = self._parse_manifest(iteration, None if base is None else base.data)
                if not change(manifest):
                    return
                data = _json_bytes(manifest)
                try:
                    if base is None:
                        version = self._call(key, partial(target.create, data), reading=False)
                    else:
                        write = partial(target.replace, data, base.version)
                        version = self._call(key, write, reading=False)
                except VersionConflict:  # changed since this process saw it: read it again
                    self._manifest_seen.pop(iteration, None)
                    continue
                self._remember_manifest(iteration, Versioned(data, version))
                return
        raise StorageError(
            f"{self._url(key)} kept changing under {_MANIFEST_RACES} conditional updates"
        )

    # ---- checkpoints -----------------------------------------------------------------

    @contextmanager
    def staged_checkpoint(self, step: int) -> Iterator[Path]:
        """A local directory to save checkpoint ``step`` into, for ``write_checkpoint``.

        On local storage it lies inside the run's ``checkpoints/``, so the commit renames it
        instead of copying every byte (weights and optimizer state are ~3x the model's
        size); elsewhere it is a temporary directory that the commit uploads. It is removed
        on exit, committed or not; one left by a killed process goes at the next prune.
        """
        if self._local:
            parent = Path(self._path("checkpoints"))
            parent.mkdir(parents=True, exist_ok=True)
            prefix = f"{_STAGING_PREFIX}{posixpath.basename(_step_dir(step))}-"
            staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        else:
            staging = Path(tempfile.mkdtemp(suffix="-ckpt"))
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def write_checkpoint(self, step: int, local_dir: str | Path, info: dict) -> str:
        """Store every file of ``local_dir`` and ``training_info.json``, then ``COMMITTED``.

        A directory from ``staged_checkpoint`` on local storage is renamed into place (its
        files are already on the right disk); any other is copied or uploaded file by file.
        """
        self._check_lease()
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise FileNotFoundError(f"checkpoint directory {local_dir} does not exist")
        ckpt = _step_dir(step)
        record = _json_bytes(info)
        self._delete_checkpoint(step)  # an older attempt at this step, committed or not
        if self._is_staged_here(local_dir):
            for stray in (COMMITTED, TRAINING_INFO):
                (local_dir / stray).unlink(missing_ok=True)
            _give_default_modes(local_dir)
            self._call(ckpt, lambda: local_dir.rename(self._path(ckpt)), reading=False)
            self._put(f"{ckpt}/{TRAINING_INFO}", record)
        else:
            relative = {
                p.relative_to(local_dir).as_posix(): p for p in sorted(local_dir.rglob("*"))
            }
            files = {
                f"{ckpt}/{name}": path
                for name, path in relative.items()
                if path.is_file() and name not in (COMMITTED, TRAINING_INFO)
            }
            with tempfile.TemporaryDirectory() as scratch:
                # Uploaded beside the weights, not after them: one round trip less.
                info_file = Path(scratch) / TRAINING_INFO
                info_file.write_bytes(record)
                self._put_files(ckpt, {**files, f"{ckpt}/{TRAINING_INFO}": info_file})
        self._put(f"{ckpt}/{COMMITTED}", datetime.now(UTC).isoformat().encode())
        return self._url(ckpt)

    def _is_staged_here(self, local_dir: Path) -> bool:
        checkpoints = Path(self._path("checkpoints")).resolve()
        return (
            self._local
            and local_dir.name.startswith(_STAGING_PREFIX)
            and local_dir.resolve().parent == checkpoints
        )

    def committed_checkpoints(self) -> list[int]:
        return self._checkpoint_listing()[1]

    def _checkpoint_listing(self) -> tuple[list[str], list[int]]:
        """The names under ``checkpoints/`` and the committed steps among them, from one
        recursive listing: one request on an object store, where a listing and a lookup of
        each step's ``COMMITTED`` marker cost one request per checkpoint more."""
        folder = self._path("checkpoints")
        try:
            paths = self._find("checkpoints")
        except FileNotFoundError:
            return [], []
        names, marked = set(), []
        for path in paths:
            parts = posixpath.relpath(str(path).rstrip("/"), folder).split("/")
            if parts[0] in (".", ".."):
                continue
            names.add(parts[0])
            if parts[1:] == [COMMITTED]:
                marked.append(parts[0])
        return sorted(names), sorted(_numbered(marked, _STEP_RE))

    def is_committed(self, step: int) -> bool:
        """Whether checkpoint ``step`` is committed: one lookup, where a listing returns
        every file of every checkpoint."""
        return self._exists(f"{_step_dir(step)}/{COMMITTED}")

    def latest_checkpoint(self) -> int | None:
        committed = self.committed_checkpoints()
        return committed[-1] if committed else None

    @property
    def on_local_disk(self) -> bool:
        """Whether the run's objects are files here (``fetch_checkpoint`` then hands out the
        stored folder itself)."""
        return self._local

    def fetch_checkpoint(self, step: int, local_dir: str | Path | None = None) -> Path:
        """A local directory with the checkpoint's files (the stored one itself on local disk
        when ``local_dir`` is None: use it read-only)."""
        ckpt = _step_dir(step)
        if not self._exists(f"{ckpt}/{COMMITTED}"):
            raise StorageError(f"{self._url(ckpt)} is not a committed checkpoint")
        if local_dir is None and self._local:
            return Path(self._path(ckpt))
        target = Path(local_dir) if local_dir is not None else Path(tempfile.mkdtemp("-ckpt"))
        target.mkdir(parents=True, exist_ok=True)
        source = self._path(ckpt)
        for remote in self._call(ckpt, lambda: self.fs.find(source)):
            relative = posixpath.relpath(remote, source)
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            self._call(ckpt, partial(self.fs.get_file, remote, str(target / relative)))
        return target

    def read_checkpoint_info(self, step: int) -> dict:
        key = f"{_step_dir(step)}/{TRAINING_INFO}"
        data = self._get_optional(key)
        if data is None:
            raise StorageError(f"{self._url(key)} does not exist")
        return json.loads(data)

    def record_checkpoint_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """Add metrics measured after the commit (validation of these weights) to a committed
        checkpoint's training info, replacing the file whole."""
        self._check_lease()
        info = {**self.read_checkpoint_info(step), **metrics}
        self._put(
            f"{_step_dir(step)}/{TRAINING_INFO}",
            _json_bytes(info),
        )

    def prune_checkpoints(
        self,
        keep_top_k: int | None,
        metric_name: str | None = None,
        higher_is_better: bool = True,
        save_period: int = 1,
        keep_newest: int = 1,
    ) -> list[int]:
        """Keep the top ``keep_top_k`` committed checkpoints (by ``metric_name`` from their
        training info, else the newest), never the newest ``keep_newest`` (async GRPO still
        generates from them); drop uncommitted leftovers older than the newest and staging
        directories of dead saves. Returns the deleted steps. ``keep_top_k=None`` keeps all.

        Every iteration commits a checkpoint (it is how weights reach the next one); those
        whose step is not a multiple of ``save_period`` are dropped once a newer one exists,
        as NeMo RL saves only every ``save_period`` steps."""
        self._check_lease()
        names, committed = self._checkpoint_listing()  # it serves every decision below
        for name in names:
            if name.startswith(_STAGING_PREFIX):  # the lease keeps other savers out
                self._delete_tree(f"checkpoints/{name}")
        all_steps = _numbered(names, _STEP_RE)
        if not committed:
            return []
        latest = committed[-1]
        kept = set(committed[-keep_newest:])
        off_period = {s for s in committed if s % save_period != 0 and s not in kept}
        for step in sorted(off_period):
            self._delete_checkpoint(step)
        committed = [s for s in committed if s not in off_period]
        if keep_top_k is None:
            return sorted(off_period)
        if metric_name is None:  # the newest are the top: no training info to read
            ranked = sorted(committed, reverse=True)
        else:
            infos = {step: self.read_checkpoint_info(step) for step in committed}
            # NeMo RL's order: best metric first, a checkpoint without it last, the newer
            # one first among equals.
            worst = -math.inf if higher_is_better else math.inf
            sign = 1 if higher_is_better else -1
            ranked = sorted(
                committed,
                key=lambda step: (sign * infos[step].get(metric_name, worst), step),
                reverse=True,
            )
        doomed = {step for step in ranked[keep_top_k:] if step not in kept}
        uncommitted = set(all_steps) - set(committed) - off_period  # dead saves
        doomed |= {s for s in uncommitted if s < latest}
        for step in sorted(doomed):
            self._delete_checkpoint(step)
        return sorted(doomed | off_period)

    def _delete_checkpoint(self, step: int) -> None:
        """Delete checkpoint ``step``, its ``COMMITTED`` marker before its other files: a
        delete cut short (a killed prune or re-save) leaves an uncommitted leftover, which
        nothing reads, never a committed checkpoint with files missing."""
        self._delete_tree(_step_dir(step), first=COMMITTED)

    # ---- stages running elsewhere ----------------------------------------------------

    def write_stage_run(self, iteration: int, stage: str, record: dict) -> None:
        """Record (and renew) a stage running in another process, e.g. on another work
        pool: who runs it and until when it promises to write this again (its heartbeat)."""
        self._put(self._stage_run_key(iteration, stage), json.dumps(record).encode())

    def read_stage_run(self, iteration: int, stage: str) -> dict | None:
        """The newest :meth:`write_stage_run` record of a stage, or None."""
        data = self._get_optional(self._stage_run_key(iteration, stage))
        return None if data is None else json.loads(data)

    def _stage_run_key(self, iteration: int, stage: str) -> str:
        return f"{STAGE_RUNS}/{_iter_dir(iteration)}.{validate_name('stage', stage)}.json"

    def write_rendezvous_note(
        self, iteration: int, stage: str, attempt: str, note: str, record: dict
    ) -> None:
        """A note of one attempt of a stage whose ranks span several machines (where node 0
        hosts the rendezvous, which nodes joined); the nodes read each other's."""
        self._put(
            self._rendezvous_key(iteration, stage, attempt, note), json.dumps(record).encode()
        )

    def read_rendezvous_note(
        self, iteration: int, stage: str, attempt: str, note: str
    ) -> dict | None:
        data = self._get_optional(self._rendezvous_key(iteration, stage, attempt, note))
        return None if data is None else json.loads(data)

    def _rendezvous_key(self, iteration: int, stage: str, attempt: str, note: str) -> str:
        names = (validate_name("stage", stage), validate_name("attempt", attempt))
        return f"{STAGE_RUNS}/{_iter_dir(iteration)}.{names[0]}.rdzv-{names[1]}.{validate_name('note', note)}.json"

    # ---- lease -----------------------------------------------------------------------

    def acquire_lease(
        self, owner: str, ttl_s: float = 3600, flow_run_id: str | None = None
    ) -> Lease:
        """Take the run's lease for ``ttl_s`` seconds (an expired one is taken over); while
        this handle holds it, its commits stop once a renewal finds the lease lost."""
        lease = Lease(self, owner, ttl_s, flow_run_id)
        lease.acquire()
        self.lease = lease
        return lease

    def lease_object(self) -> ConditionalObject:
        """``LEASE.json`` as an object written only if unchanged (the store's own CAS)."""
        path = self._path(LEASE_KEY)
        if self._local:
            return LocalObject(path)
        if self.fs.protocol in ("s3", ("s3", "s3a")) or "s3" in self.fs.protocol:
            return S3Object(self.fs, path)
        raise StorageError(
            f"{self.root}: an exclusive run lease needs file:// or s3:// storage "
            f"(the store's conditional writes), not {self.fs.protocol}"
        )

    def _read_lease(self) -> dict | None:
        current = self.lease_object().read()
        return None if current is None else json.loads(current.data)

    def _check_lease(self) -> None:
        """Refuse a commit once this handle's lease was found taken by another run."""
        if self.lease is not None:
            self.lease.check()

    # ---- primitives ------------------------------------------------------------------

    def _stage_key(self, iteration: int, stage: str, filename: str) -> str:
        return f"{_iter_dir(iteration)}/{validate_name('stage', stage)}/{filename}"

    def _path(self, key: str) -> str:
        return posixpath.join(self._run_path, key) if key else self._run_path

    def _url(self, key: str) -> str:
        return f"{self.run_url}/{key}" if key else self.run_url

    def _check_key(self, key: str) -> None:
        parts = key.split("/")
        if key.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"object key {key!r} must be relative to the run, without '..'")

    def _call(self, key: str, op: Callable[[], T], reading: bool = True) -> T:
        """Run one fsspec operation; connection and service errors become ``StorageError``.

        A missing object stays ``FileNotFoundError`` when reading (callers decide what
        absence means); when writing it means a missing bucket, a ``StorageError``.
        """
        try:
            return retry_within_budget(op, f"storage operation on {self._url(key)}", _TRANSIENT)
        except StorageUnreachableError:
            raise
        except FileNotFoundError as exc:
            if reading:
                raise
            raise StorageError(f"cannot write {self._url(key)}: {exc}") from exc
        except _TRANSIENT as exc:
            raise StorageError(f"storage operation on {self._url(key)} failed: {exc}") from exc

    def _put(self, key: str, data: bytes, remember: bool = False) -> ObjectRef:
        """Write ``data`` at ``key`` so that readers see the whole object or nothing;
        ``remember`` keeps the bytes for this process's next reads (see ``RecentWrites``)."""
        self._check_key(key)
        path = self._path(key)
        digest = _HASHER.submit(_sha256, data)  # hashed while it is written
        if self._local:
            self._call(key, lambda: _local_atomic_write(path, data), reading=False)
        else:
            self._call(key, lambda: self.fs.pipe_file(path, data), reading=False)
        ref = ObjectRef(key=key, size=len(data), sha256=digest.result())
        if remember:
            self._recent.remember(key, ref.sha256, data)
        else:
            self._recent.discard(key)
        return ref

    def forget_writes(self) -> None:
        """Read every object and manifest from the store again, not from what this process
        wrote: a flow run starts with this, so it sees what others changed meanwhile, such
        as an input damaged since, which it then has re-made."""
        self._recent.forget()
        with _MANIFEST_LOCK:
            self._manifest_seen.clear()

    def _put_files(self, folder: str, files: dict[str, Path]) -> None:
        """Store each local file at its key (every key under ``folder``). On an object
        store the uploads run concurrently, in one retried call: each PUT is atomic and
        idempotent, and nothing refers to the files until the caller's marker is written."""
        for key in files:
            self._check_key(key)
        if self._local:
            for key, local_path in files.items():
                path = self._path(key)
                self._call(key, partial(_local_atomic_copy, local_path, path), reading=False)
            return
        if not files:
            return
        sources = [str(local_path) for local_path in files.values()]
        targets = [self._path(key) for key in files]
        self._call(folder, lambda: self.fs.put(sources, targets), reading=False)

    def _get_optional(self, key: str, size: int | None = None) -> bytes | None:
        """The object's bytes, or None where there is none. On S3 an object that fits one
        block (``size`` unknown: manifests, records, configs are small) is one GET: s3fs
        would otherwise ask for its size first (a HEAD, and on a missing key a listing) to
        decide on a ranged, concurrent download."""
        path = self._path(key)
        options = {}
        if self._s3 and (size is None or size <= self.fs.default_block_size):
            options["max_concurrency"] = 1
        try:
            return self._call(key, lambda: self.fs.cat_file(path, **options))
        except FileNotFoundError:
            return None

    def _get_mapped(self, key: str, size: int | None = None) -> bytes | mmap.mmap | None:
        """A local object as a copy-on-write map of its file: hashed and decoded straight
        from the page cache instead of copied into fresh memory; decoded tensors may view
        it, and writing to them never reaches the file. Commits replace files by rename,
        never in place, so the map cannot change under us."""
        if not self._local:
            return self._get_optional(key, size)
        try:
            return self._call(key, lambda: map_file(self._path(key)))
        except FileNotFoundError:
            return None

    def _get_verified(
        self,
        ref: ObjectRef,
        decode: Callable[[Any], T],
        mapped: bool = False,
        recent: bool = False,
    ) -> T:
        """Fetch ``ref`` and decode it while its sha256 is checked; a mismatch in size or
        digest raises ``IntegrityError`` (also when the damage made decoding fail).
        ``mapped`` lets ``decode`` take a memory map of a local file instead of bytes;
        ``recent`` takes the bytes this process wrote under that sha256, if it still has
        them, instead of a download (a private copy: decoded tensors may be written)."""
        self._check_key(ref.key)
        if recent and (written := self._recent.get(ref.key, ref.size, ref.sha256)) is not None:
            return decode(bytearray(written))
        if mapped:
            data = self._get_mapped(ref.key, ref.size)
        else:
            data = self._get_optional(ref.key, ref.size)
        if data is None or len(data) != ref.size:
            raise IntegrityError(self._mismatch(ref, data, None))
        digest = _HASHER.submit(_sha256, data)
        try:
            value = decode(data)
        finally:
            if digest.result() != ref.sha256:
                raise IntegrityError(self._mismatch(ref, data, digest.result()))
        return value

    def _mismatch(self, ref: ObjectRef, data: Any, sha256: str | None) -> str:
        url = self._url(ref.key)
        if data is None:
            return f"{url} is missing (expected {ref.size} bytes)"
        if len(data) != ref.size:
            return f"{url} has {len(data)} bytes, its reference says {ref.size}"
        return f"{url} has sha256 {sha256}, its reference says {ref.sha256}"

    # ---- verification ----------------------------------------------------------------

    def verify(self) -> list[str]:
        """Every object the run recorded, checked against its recorded size and sha256: the
        outputs of each complete stage and every file of each committed checkpoint. Returns
        one line per damaged object (its URL, what was expected, what was found)."""
        damaged = []
        for iteration in self.iterations():
            for entry in self.read_manifest(iteration)["stages"].values():
                if entry.get("status") == "complete":
                    refs = [ObjectRef.from_dict(r) for r in entry.get("outputs", {}).values()]
                    damaged += [p for ref in refs if (p := self._problem(ref)) is not None]
        for step in self.committed_checkpoints():
            info = self.read_checkpoint_info(step)
            for relative, recorded in sorted(info.get("files", {}).items()):
                ref = ObjectRef(f"{_step_dir(step)}/{relative}", **recorded)
                damaged += [p for p in [self._problem(ref)] if p is not None]
        return damaged

    def _problem(self, ref: ObjectRef) -> str | None:
        data = self._get_mapped(ref.key, ref.size)
        if data is None or len(data) != ref.size:
            return self._mismatch(ref, data, None)
        sha256 = _sha256(data)
        return None if sha256 == ref.sha256 else self._mismatch(ref, data, sha256)

    def _size_optional(self, key: str) -> int | None:
        try:
            return int(self._call(key, lambda: self.fs.size(self._path(key))))
        except FileNotFoundError:
            return None

    def _exists(self, key: str) -> bool:
        return self._size_optional(key) is not None

    def _list_names(self, key: str) -> list[str]:
        """Names of the entries directly under ``key`` (empty if it does not exist)."""
        path = self._path(key)
        try:
            entries = self._call(key, lambda: self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []
        return [posixpath.basename(str(entry).rstrip("/")) for entry in entries]

    def _find(self, key: str) -> list[str]:
        """Paths of everything under ``key``: on a disk its files and folders (a folder can
        be empty there: a save that died at once); on S3 its objects, from one listing
        (s3fs looks the key itself up, a lookup and a listing more, when nothing is under
        it, unless the key is passed as a prefix of its parent)."""
        path = self._path(key)
        if self._s3:
            parent, name = posixpath.split(path)
            return self._call(key, lambda: self.fs.find(parent, prefix=f"{name}/"))
        return self._call(key, lambda: self.fs.find(path, withdirs=self._local))

    def _delete_tree(self, key: str, first: str | None = None) -> None:
        """Delete everything under ``key``, if anything; the object ``key/first``, if there,
        before the others. On an object store that is one listing and a bulk delete of the
        keys found: asking whether the folder exists and removing it recursively would cost
        a lookup and two more listings."""
        path = self._path(key)
        head = posixpath.join(path, first) if first else None
        try:
            if self._local:
                if self._call(key, lambda: self.fs.exists(path)):
                    if head is not None:
                        Path(head).unlink(missing_ok=True)
                    self._call(key, lambda: self.fs.rm(path, recursive=True))
                return
            objects = self._find(key)
            if head in objects:
                self._call(key, lambda: self.fs.rm([head]))
                objects.remove(head)
            if objects:
                self._call(key, lambda: self.fs.rm(objects))
        except FileNotFoundError:
            pass


def _json_bytes(obj: dict) -> bytes:
    """How the run's JSON objects are stored: indented, keys sorted (diffable by hand)."""
    return json.dumps(obj, indent=2, sort_keys=True).encode()


def _sha256(data: bytes | mmap.mmap) -> str:
    return hashlib.sha256(data).hexdigest()


def _iter_dir(iteration: int) -> str:
    return f"iter_{_non_negative('iteration', iteration):06d}"


def _step_dir(step: int) -> str:
    return f"checkpoints/step_{_non_negative('step', step):06d}"


def _non_negative(kind: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{kind} must be a non-negative int, got {value!r}")
    return value


def _numbered(names: list[str], pattern: re.Pattern[str]) -> list[int]:
    return [int(m.group(1)) for name in names if (m := pattern.fullmatch(name))]


def _diff_keys(old: Any, new: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() | new.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                yield path
            else:
                yield from _diff_keys(old[key], new[key], path)
    elif old != new:
        yield prefix or "<root>"


@contextmanager
def _temporary_sibling(path: str) -> Iterator[Path]:
    """A temporary file next to ``path`` that is removed unless it was renamed onto it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def _give_default_modes(root: Path) -> None:
    """The modes the process's umask gives new files and folders, for everything under
    ``root``: a staging folder is private (mkdtemp) and some writers create files 0600,
    which a committed checkpoint must not keep."""
    umask = _process_umask()
    root.chmod(0o777 & ~umask)
    for path in root.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _process_umask() -> int:
    """The umask, read without setting it (``os.umask`` would change it for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _local_atomic_write(path: str, data: bytes) -> None:
    with _temporary_sibling(path) as tmp:
        with open(tmp, "wb") as file:
            file.write(data)
        tmp.replace(path)


def _local_atomic_copy(source: Path, path: str) -> None:
    with _temporary_sibling(path) as tmp:
        shutil.copyfile(source, tmp)
        tmp.replace(path)

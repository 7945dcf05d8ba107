"""Run storage: the front of the one package that knows the layout of a run on object
storage (``nemo_rl_core.storage``; nothing outside it reads a manifest's keys).

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

``RunStorage`` is a thin front over the run's three sections, a module each:
``object_store`` (objects written whole, read back checked by sha256; stage outputs),
``manifest_store`` (manifests, part entries, stale marks, repairs, stage-run records) and
``checkpoint_store`` (save, commit marker, list, fetch, prune, training info). The front
checks the lease before every commit and keeps the method names callers use.
"""

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.checkpoint_store import CheckpointStore, Retention
from nemo_rl_core.storage.containers import ARROW, BatchFormat
from nemo_rl_core.storage.layout import COMMITTED, MANIFEST, STAGE_RUNS, iter_dir
from nemo_rl_core.storage.lease import ConditionalObject, Lease, lease_object
from nemo_rl_core.storage.manifest import Manifest, RanOn, StageEntry, StageRun
from nemo_rl_core.storage.manifest_store import ManifestStore
from nemo_rl_core.storage.names import validate_name
from nemo_rl_core.storage.object_store import IntegrityError, ObjectRef, ObjectStore
from nemo_rl_core.storage.outage import StorageError
from nemo_rl_core.storage.progress import StoredProgress, stored_progress
from nemo_rl_core.storage.verification import RunCheck, check_run

__all__ = [
    "COMMITTED",
    "ConfigConflictError",
    "IntegrityError",
    "ObjectRef",
    "Retention",
    "RunStorage",
    "StorageError",
    "validate_name",
]


class ConfigConflictError(ValueError):
    """The run already has a different config; names the keys that differ."""


class RunStorage:
    """Reads and writes one run's config, stage outputs, manifests, checkpoints and lease.

    ``batch_format`` is the container of stage outputs: ``"arrow"`` (Arrow IPC, read
    zero-copy; the default) or ``"parquet"`` (for runs whose outputs other tools read).
    Reads take either, so a run can switch, and outputs of older runs stay readable.

    Each method hands over to its section (``objects``, ``manifests``, ``checkpoints``),
    whose method of the same name says what it does; the commits check the lease first.
    """

    def __init__(
        self,
        root: str,
        run_id: str,
        storage_options: dict | None = None,
        batch_format: BatchFormat = ARROW,
    ) -> None:
        self.run_id = validate_name("run id", run_id)
        self.objects = ObjectStore(root, self.run_id, storage_options, batch_format)
        self.manifests = ManifestStore(self.objects)
        self.checkpoints = CheckpointStore(self.objects)
        self.batch_format = self.objects.batch_format
        self.root = self.objects.root
        self.fs = self.objects.fs
        self.run_url = self.objects.run_url
        self.lease: Lease | None = None

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
        return self.objects.put("config.yaml", data)

    def read_run_config(self) -> dict | None:
        data = self.objects.get_optional("config.yaml")
        return None if data is None else yaml.safe_load(data)

    # ---- stage outputs ---------------------------------------------------------------

    def write_batch(
        self, iteration: int, stage: str, batch: BatchedDataDict, name: str = "batch"
    ) -> ObjectRef:
        return self.objects.write_batch(iteration, stage, batch, name)

    def read_batch(self, ref: ObjectRef) -> BatchedDataDict:
        return self.objects.read_batch(ref)

    def write_outputs(
        self,
        iteration: int,
        stage: str,
        outputs: Mapping[str, BatchedDataDict | dict],
        prefix: str = "",
    ) -> dict[str, ObjectRef]:
        return self.objects.write_outputs(iteration, stage, outputs, prefix)

    def write_json(self, iteration: int, stage: str, name: str, obj: dict) -> ObjectRef:
        return self.objects.write_json(iteration, stage, name, obj)

    def read_json(self, ref: ObjectRef) -> dict:
        return self.objects.read_json(ref)

    # ---- manifest --------------------------------------------------------------------

    def read_manifest(self, iteration: int) -> Manifest:
        return self.manifests.read_manifest(iteration)

    def record_stage(
        self,
        iteration: int,
        stage: str,
        inputs: dict[str, str],
        outputs: dict[str, ObjectRef],
        metrics: dict | None = None,
        ran_on: RanOn | None = None,
    ) -> StageEntry:
        self._check_lease()
        return self.manifests.record_stage(iteration, stage, inputs, outputs, metrics, ran_on)

    def completed_stage(
        self, iteration: int, stage: str, inputs: dict[str, str]
    ) -> StageEntry | None:
        return self.manifests.completed_stage(iteration, stage, inputs)

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
        self._check_lease()
        return self.manifests.record_part(iteration, stage, part, inputs, outputs, metrics, ran_on)

    def completed_part(
        self, iteration: int, stage: str, part: str, inputs: dict[str, str]
    ) -> StageEntry | None:
        return self.manifests.completed_part(iteration, stage, part, inputs)

    def mark_stale(self, iteration: int, stages: list[str]) -> None:
        self._check_lease()
        self.manifests.mark_stale(iteration, stages)

    def record_repair(self, iteration: int, key: str, damage: str) -> None:
        self._check_lease()
        self.manifests.record_repair(iteration, key, damage)

    def iterations(self) -> list[int]:
        return self.manifests.iterations()

    # ---- checkpoints -----------------------------------------------------------------

    def staged_checkpoint(self, step: int) -> AbstractContextManager[Path]:
        return self.checkpoints.staged_checkpoint(step)

    def write_checkpoint(self, step: int, local_dir: str | Path, info: dict) -> str:
        self._check_lease()
        return self.checkpoints.write_checkpoint(step, local_dir, info)

    def committed_checkpoints(self) -> list[int]:
        return self.checkpoints.committed_checkpoints()

    def is_committed(self, step: int) -> bool:
        return self.checkpoints.is_committed(step)

    def latest_checkpoint(self) -> int | None:
        return self.checkpoints.latest_checkpoint()

    @property
    def on_local_disk(self) -> bool:
        """Whether the run's objects are files here (``fetch_checkpoint`` then hands out the
        stored folder itself)."""
        return self.objects.local

    def fetch_checkpoint(self, step: int, local_dir: str | Path | None = None) -> Path:
        return self.checkpoints.fetch_checkpoint(step, local_dir)

    def read_checkpoint_info(self, step: int) -> dict:
        return self.checkpoints.read_checkpoint_info(step)

    def record_checkpoint_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self._check_lease()
        self.checkpoints.record_checkpoint_metrics(step, metrics)

    def prune_checkpoints(
        self,
        keep_top_k: int | None,
        metric_name: str | None = None,
        higher_is_better: bool = True,
        save_period: int = 1,
        keep_newest: int = 1,
    ) -> Retention:
        self._check_lease()
        return self.checkpoints.prune_checkpoints(
            keep_top_k, metric_name, higher_is_better, save_period, keep_newest
        )

    # ---- stages running elsewhere ----------------------------------------------------

    def write_stage_run(self, iteration: int, stage: str, record: StageRun) -> None:
        self.manifests.write_stage_run(iteration, stage, record)

    def read_stage_run(self, iteration: int, stage: str) -> StageRun | None:
        return self.manifests.read_stage_run(iteration, stage)

    def write_rendezvous_note(
        self, iteration: int, stage: str, attempt: str, note: str, record: dict
    ) -> None:
        self.manifests.write_rendezvous_note(iteration, stage, attempt, note, record)

    def read_rendezvous_note(
        self, iteration: int, stage: str, attempt: str, note: str
    ) -> dict | None:
        return self.manifests.read_rendezvous_note(iteration, stage, attempt, note)

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
        return lease_object(self.objects.opened, self.run_id)

    def _check_lease(self) -> None:
        """Refuse a commit once this handle's lease was found taken by another run."""
        if self.lease is not None:
            self.lease.check()

    # ---- progress --------------------------------------------------------------------

    def stored_progress(self, committing_stage: str) -> StoredProgress:
        return stored_progress(self.objects, self.manifests, self.checkpoints, committing_stage)

    def discard_progress(self) -> tuple[list[int], list[int]]:
        """Delete every iteration, checkpoint and stage-run record of the run (its config
        and lease stay): a deliberate start over. Returns the iterations and the committed
        checkpoints deleted."""
        self._check_lease()
        iterations, committed = self.iterations(), self.committed_checkpoints()
        self.checkpoints.delete_all()
        for iteration in reversed(iterations):
            self.objects.delete_tree(iter_dir(iteration), first=MANIFEST)
        self.objects.delete_tree(STAGE_RUNS)
        self.forget_writes()
        return iterations, committed

    # ---- reading what the store holds ------------------------------------------------

    def forget_writes(self) -> None:
        """Read every object and manifest from the store again, not from what this process
        wrote: a flow run starts with this, so it sees what others changed meanwhile, such
        as an input damaged since, which it then has re-made."""
        self.objects.recent.forget()
        self.manifests.forget()

    def verify(self) -> RunCheck:
        """Every object the run recorded, read back and checked against its recorded size
        and sha256: the outputs of every entry, stale ones too, and every file of each
        committed checkpoint (``verification.check_run``)."""
        return check_run(self.objects, self.manifests, self.checkpoints)


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

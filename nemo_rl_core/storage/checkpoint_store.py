"""The checkpoints of a run: ``checkpoints/step_<n>/`` with its files, ``training_info.json``
and, written last, ``COMMITTED``; a checkpoint without that marker does not count.
Listing, fetching and pruning them, and the training info recorded with each."""

import contextlib
import json
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from nemo_rl_core.storage.layout import (
    COMMITTED,
    STAGING_PREFIX,
    STEP_RE,
    TRAINING_INFO,
    numbered,
    step_dir,
)
from nemo_rl_core.storage.object_store import ObjectRef, ObjectStore, json_bytes
from nemo_rl_core.storage.outage import StorageError
from nemo_rl_core.utils.checkpoint_manager import rank_checkpoints


@dataclass(frozen=True)
class Retention:
    """What a pruning did: the steps it deleted and the committed ones that stay."""

    deleted: list[int]
    kept: list[int]


class CheckpointStore:
    """Saves, lists, fetches and prunes one run's checkpoints, in its ``ObjectStore``."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects

    @contextmanager
    def staged_checkpoint(self, step: int) -> Iterator[Path]:
        """A local directory to save checkpoint ``step`` into, for ``write_checkpoint``.

        On local storage it lies inside the run's ``checkpoints/``, so the commit renames it
        instead of copying every byte (weights and optimizer state are ~3x the model's
        size); elsewhere it is a temporary directory that the commit uploads. It is removed
        on exit, committed or not; one left by a killed process goes at the next prune.
        """
        if self.objects.local:
            parent = Path(self.objects.path("checkpoints"))
            parent.mkdir(parents=True, exist_ok=True)
            prefix = f"{STAGING_PREFIX}{posixpath.basename(step_dir(step))}-"
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
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise FileNotFoundError(f"checkpoint directory {local_dir} does not exist")
        ckpt = step_dir(step)
        record = json_bytes(info)
        self._delete_checkpoint(step)  # an older attempt at this step, committed or not
        if self._is_staged_here(local_dir):
            for stray in (COMMITTED, TRAINING_INFO):
                (local_dir / stray).unlink(missing_ok=True)
            _give_default_modes(local_dir)
            rename = partial(local_dir.rename, self.objects.path(ckpt))
            self.objects.call("rename into place", ckpt, rename, reading=False)
            self.objects.put(f"{ckpt}/{TRAINING_INFO}", record)
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
                self.objects.put_files(ckpt, {**files, f"{ckpt}/{TRAINING_INFO}": info_file})
        self.objects.put(f"{ckpt}/{COMMITTED}", datetime.now(UTC).isoformat().encode())
        return self.objects.url(ckpt)

    def _is_staged_here(self, local_dir: Path) -> bool:
        checkpoints = Path(self.objects.path("checkpoints")).resolve()
        return (
            self.objects.local
            and local_dir.name.startswith(STAGING_PREFIX)
            and local_dir.resolve().parent == checkpoints
        )

    def committed_checkpoints(self) -> list[int]:
        return self._checkpoint_listing()[1]

    def _checkpoint_listing(self) -> tuple[list[str], list[int]]:
        """The names under ``checkpoints/`` and the committed steps among them, from one
        recursive listing: one request on an object store, where a listing and a lookup of
        each step's ``COMMITTED`` marker cost one request per checkpoint more."""
        folder = self.objects.path("checkpoints")
        try:
            paths = self.objects.find("checkpoints")
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
        return sorted(names), sorted(numbered(marked, STEP_RE))

    def is_committed(self, step: int) -> bool:
        """Whether checkpoint ``step`` is committed: one lookup, where a listing returns
        every file of every checkpoint."""
        return self.objects.exists(f"{step_dir(step)}/{COMMITTED}")

    def latest_checkpoint(self) -> int | None:
        committed = self.committed_checkpoints()
        return committed[-1] if committed else None

    def fetch_checkpoint(self, step: int, local_dir: str | Path | None = None) -> Path:
        """A local directory with the checkpoint's files (the stored one itself on local disk
        when ``local_dir`` is None: use it read-only)."""
        ckpt = step_dir(step)
        if not self.objects.exists(f"{ckpt}/{COMMITTED}"):
            raise StorageError(f"{self.objects.url(ckpt)} is not a committed checkpoint")
        if local_dir is None and self.objects.local:
            return Path(self.objects.path(ckpt))
        target = Path(local_dir) if local_dir is not None else Path(tempfile.mkdtemp("-ckpt"))
        target.mkdir(parents=True, exist_ok=True)
        source = self.objects.path(ckpt)
        fs = self.objects.fs
        for remote in self.objects.call("listing", ckpt, lambda: fs.find(source)):
            relative = posixpath.relpath(remote, source)
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            self.objects.call(
                "download",
                f"{ckpt}/{relative}",
                partial(fs.get_file, remote, str(target / relative)),
            )
        return target

    def read_checkpoint_info(self, step: int) -> dict:
        key = f"{step_dir(step)}/{TRAINING_INFO}"
        data = self.objects.get_optional(key)
        if data is None:
            raise StorageError(f"{self.objects.url(key)} does not exist")
        return json.loads(data)

    def recorded_files(self, step: int) -> list[ObjectRef]:
        """The files of checkpoint ``step`` as its training info recorded them (key, size,
        sha256); ``StorageError`` if it has no training info."""
        info = self.read_checkpoint_info(step)
        return [
            ObjectRef(f"{step_dir(step)}/{relative}", int(file["size"]), str(file["sha256"]))
            for relative, file in sorted(info.get("files", {}).items())
        ]

    def record_checkpoint_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """Add metrics measured after the commit (validation of these weights) to a committed
        checkpoint's training info, replacing the file whole."""
        info = {**self.read_checkpoint_info(step), **metrics}
        self.objects.put(
            f"{step_dir(step)}/{TRAINING_INFO}",
            json_bytes(info),
        )

    def prune_checkpoints(
        self,
        keep_top_k: int | None,
        metric_name: str | None = None,
        higher_is_better: bool = True,
        save_period: int = 1,
        keep_newest: int = 1,
    ) -> Retention:
        """Keep the top ``keep_top_k`` committed checkpoints (by ``metric_name`` from their
        training info, else the newest), never the newest ``keep_newest`` (async GRPO still
        generates from them); drop uncommitted leftovers older than the newest and staging
        directories of dead saves. Returns the deleted steps and the committed ones kept
        (from the listing it decided on: no second listing). ``keep_top_k=None`` keeps all.

        Every iteration commits a checkpoint (it is how weights reach the next one); those
        whose step is not a multiple of ``save_period`` are dropped once a newer one exists,
        as NeMo RL saves only every ``save_period`` steps."""
        names, committed = self._checkpoint_listing()  # it serves every decision below
        for name in names:
            if name.startswith(STAGING_PREFIX):  # the lease keeps other savers out
                self.objects.delete_tree(f"checkpoints/{name}")
        all_steps = numbered(names, STEP_RE)
        if not committed:
            return Retention([], [])
        latest = committed[-1]
        kept = set(committed[-keep_newest:])
        off_period = {s for s in committed if s % save_period != 0 and s not in kept}
        for step in sorted(off_period):
            self._delete_checkpoint(step)
        committed = [s for s in committed if s not in off_period]
        if keep_top_k is None:
            return Retention(sorted(off_period), committed)
        ranked = rank_checkpoints(
            committed, metric_name, higher_is_better, self.read_checkpoint_info
        )
        doomed = {step for step in ranked[keep_top_k:] if step not in kept}
        uncommitted = set(all_steps) - set(committed) - off_period  # dead saves
        doomed |= {s for s in uncommitted if s < latest}
        for step in sorted(doomed):
            self._delete_checkpoint(step)
        return Retention(sorted(doomed | off_period), [s for s in committed if s not in doomed])

    def delete_all(self) -> None:
        """Delete every checkpoint: each committed one marker first, then what is left."""
        for step in reversed(self.committed_checkpoints()):
            self._delete_checkpoint(step)
        self.objects.delete_tree("checkpoints")

    def _delete_checkpoint(self, step: int) -> None:
        """Delete checkpoint ``step``, its ``COMMITTED`` marker before its other files: a
        delete cut short (a killed prune or re-save) leaves an uncommitted leftover, which
        nothing reads, never a committed checkpoint with files missing."""
        self.objects.delete_tree(step_dir(step), first=COMMITTED)


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

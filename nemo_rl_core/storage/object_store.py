"""The objects of one run on an fsspec store: each written whole (atomically) and read back
checked against its size and sha256; stage outputs in their containers.

This is the bottom of the run storage: it knows no manifest, no checkpoint and no lease
(the ``RunStorage`` front checks the lease before each commit). Whoever writes here
directly writes behind the manifest's back: the manifest and checkpoint sections do it
by design, fault injection (``tasks/faults.py``) to damage an output on purpose.
"""

import hashlib
import json
import mmap
import posixpath
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Self, TypeVar

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.codec import batch_from_bytes, batch_to_bytes
from nemo_rl_core.storage.containers import SUFFIXES, BatchFormat, check_format, map_file
from nemo_rl_core.storage.filesystem import open_root
from nemo_rl_core.storage.layout import stage_key
from nemo_rl_core.storage.names import validate_name
from nemo_rl_core.storage.outage import (
    StorageError,
    StorageUnreachableError,
    retry_within_budget,
)
from nemo_rl_core.storage.recent_writes import RecentWrites
from nemo_rl_core.storage.slow_calls import watching

T = TypeVar("T")

_RECENT_WRITE_BYTES = 256 << 20  # stage outputs kept for the next stages (object stores)
# sha256 releases the GIL on large buffers: hashing runs beside the transfer or decode.
_HASHER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="run-storage-sha256")
_OUTPUT_WRITERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="run-storage-outputs")

try:  # s3fs raises botocore's errors for connection trouble; other backends only OSError
    from botocore.exceptions import BotoCoreError, ClientError

    _TRANSIENT: tuple[type[BaseException], ...] = (OSError, BotoCoreError, ClientError)
except ImportError:  # pragma: no cover - botocore comes with s3fs
    _TRANSIENT = (OSError,)


class IntegrityError(StorageError):
    """An object does not match its manifest entry (size or sha256) or is corrupt."""


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


class ObjectStore:
    """One run's objects under ``<root>/runs/<run_id>/``, by key relative to that folder."""

    def __init__(
        self,
        root: str,
        run_id: str,
        storage_options: dict | None,
        batch_format: BatchFormat,
    ) -> None:
        self.batch_format = check_format(batch_format)
        self.opened = open_root(root, storage_options)
        opened = self.opened
        self.root, self.fs, self.s3, self.local = opened.url, opened.fs, opened.s3, opened.local
        self.run_path = opened.run_path(run_id)
        self.run_url = opened.run_url(run_id)
        self.recent = RecentWrites(0 if self.local else _RECENT_WRITE_BYTES)

    # ---- stage outputs ---------------------------------------------------------------

    def write_batch(
        self, iteration: int, stage: str, batch: BatchedDataDict, name: str = "batch"
    ) -> ObjectRef:
        """Store a batch at ``iter_<n>/<stage>/<name>.arrow`` (or ``.parquet``), atomically."""
        filename = validate_name("name", name) + SUFFIXES[self.batch_format]
        key = stage_key(iteration, stage, filename)
        return self.put(key, batch_to_bytes(batch, format=self.batch_format), remember=True)

    def read_batch(self, ref: ObjectRef) -> BatchedDataDict:
        """Read a stored batch of either container; its size and sha256 must match ``ref``
        (else IntegrityError). Tensors may view the object's (copy-on-write) memory map."""
        source = self.url(ref.key)
        # sha256 covers every byte, so Parquet's page CRCs need not be checked again.
        return self.get_verified(
            ref,
            lambda data: batch_from_bytes(data, source=source, verify_checksums=False),
            mapped=True,
            recent=True,
        )

    def write_outputs(
        self,
        iteration: int,
        stage: str,
        outputs: Mapping[str, BatchedDataDict | dict],
        prefix: str = "",
    ) -> dict[str, ObjectRef]:
        """Store a stage's outputs, each at ``<prefix><name>``: a batch as ``write_batch``
        does, a dict as ``write_json``. The second and later are written from other threads
        while the first is written here: a stage with several outputs waits for one round
        trip to an object store, not one per output."""

        def write(name: str, value: BatchedDataDict | dict) -> ObjectRef:
            if isinstance(value, BatchedDataDict):
                return self.write_batch(iteration, stage, value, name=prefix + name)
            return self.write_json(iteration, stage, prefix + name, value)

        items = list(outputs.items())
        others = {name: _OUTPUT_WRITERS.submit(write, name, value) for name, value in items[1:]}
        refs = {name: write(name, value) for name, value in items[:1]}
        return refs | {name: future.result() for name, future in others.items()}

    def write_json(self, iteration: int, stage: str, name: str, obj: dict) -> ObjectRef:
        key = stage_key(iteration, stage, f"{validate_name('name', name)}.json")
        return self.put(key, json_bytes(obj), remember=True)

    def read_json(self, ref: ObjectRef) -> dict:
        try:
            return self.get_verified(ref, json.loads, recent=True)
        except ValueError as exc:
            raise IntegrityError(f"{self.url(ref.key)} is not valid JSON: {exc}") from exc

    # ---- primitives ------------------------------------------------------------------

    def path(self, key: str) -> str:
        return posixpath.join(self.run_path, key) if key else self.run_path

    def url(self, key: str) -> str:
        return f"{self.run_url}/{key}" if key else self.run_url

    def check_key(self, key: str) -> None:
        parts = key.split("/")
        if key.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"object key {key!r} must be relative to the run, without '..'")

    def call(self, action: str, key: str, op: Callable[[], T], reading: bool = True) -> T:
        """Run one fsspec operation, ``action`` (``read``, ``write``, ``list`` ...) of ``key``:
        every storage call of the run passes here. Connection and service errors become
        ``StorageError``; a call that waits long is logged while it waits (``slow_calls``).

        A missing object stays ``FileNotFoundError`` when reading (callers decide what
        absence means); when writing it means a missing bucket, a ``StorageError``.
        """
        what = f"{action} of {self.url(key)}"
        try:
            with watching(action, self.url(key)):
                return retry_within_budget(op, what, _TRANSIENT)
        except StorageUnreachableError:
            raise
        except FileNotFoundError as exc:
            if reading:
                raise
            raise StorageError(f"cannot write {self.url(key)}: {exc}") from exc
        except _TRANSIENT as exc:
            raise StorageError(f"{what} failed: {exc}") from exc

    def put(self, key: str, data: bytes, remember: bool = False) -> ObjectRef:
        """Write ``data`` at ``key`` so that readers see the whole object or nothing;
        ``remember`` keeps the bytes for this process's next reads (see ``RecentWrites``)."""
        self.check_key(key)
        path = self.path(key)
        digest = _HASHER.submit(sha256_of, data)  # hashed while it is written
        if self.local:
            self.call("write", key, lambda: _local_atomic_write(path, data), reading=False)
        else:
            self.call("write", key, lambda: self.fs.pipe_file(path, data), reading=False)
        ref = ObjectRef(key=key, size=len(data), sha256=digest.result())
        if remember:
            self.recent.remember(key, ref.sha256, data)
        else:
            self.recent.discard(key)
        return ref

    def put_files(self, folder: str, files: dict[str, Path]) -> None:
        """Store each local file at its key (every key under ``folder``). On an object
        store the uploads run concurrently, in one retried call: each PUT is atomic and
        idempotent, and nothing refers to the files until the caller's marker is written."""
        for key in files:
            self.check_key(key)
        if self.local:
            for key, local_path in files.items():
                path = self.path(key)
                self.call(
                    "write", key, partial(_local_atomic_copy, local_path, path), reading=False
                )
            return
        if not files:
            return
        sources = [str(local_path) for local_path in files.values()]
        targets = [self.path(key) for key in files]
        self.call("upload", folder, lambda: self.fs.put(sources, targets), reading=False)

    def get_optional(self, key: str, size: int | None = None) -> bytes | None:
        """The object's bytes, or None where there is none. On S3 an object that fits one
        block (``size`` unknown: manifests, records, configs are small) is one GET: s3fs
        would otherwise ask for its size first (a HEAD, and on a missing key a listing) to
        decide on a ranged, concurrent download."""
        path = self.path(key)
        options = {}
        if self.s3 and (size is None or size <= self.fs.default_block_size):
            options["max_concurrency"] = 1
        try:
            return self.call("read", key, lambda: self.fs.cat_file(path, **options))
        except FileNotFoundError:
            return None

    def get_mapped(self, key: str, size: int | None = None) -> bytes | mmap.mmap | None:
        """A local object as a copy-on-write map of its file: hashed and decoded straight
        from the page cache instead of copied into fresh memory; decoded tensors may view
        it, and writing to them never reaches the file. Commits replace files by rename,
        never in place, so the map cannot change under us."""
        if not self.local:
            return self.get_optional(key, size)
        try:
            return self.call("read", key, lambda: map_file(self.path(key)))
        except FileNotFoundError:
            return None

    def get_verified(
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
        self.check_key(ref.key)
        if recent and (written := self.recent.get(ref.key, ref.size, ref.sha256)) is not None:
            return decode(bytearray(written))
        if mapped:
            data = self.get_mapped(ref.key, ref.size)
        else:
            data = self.get_optional(ref.key, ref.size)
        if data is None or len(data) != ref.size:
            raise IntegrityError(self.mismatch(ref, data, None))
        digest = _HASHER.submit(sha256_of, data)
        try:
            value = decode(data)
        finally:
            if digest.result() != ref.sha256:
                raise IntegrityError(self.mismatch(ref, data, digest.result()))
        return value

    def mismatch(self, ref: ObjectRef, data: Any, sha256: str | None) -> str:
        url = self.url(ref.key)
        if data is None:
            return f"{url} is missing (expected {ref.size} bytes)"
        if len(data) != ref.size:
            return f"{url} has {len(data)} bytes, its reference says {ref.size}"
        return f"{url} has sha256 {sha256}, its reference says {ref.sha256}"

    def problem(self, ref: ObjectRef) -> str | None:
        data = self.get_mapped(ref.key, ref.size)
        if data is None or len(data) != ref.size:
            return self.mismatch(ref, data, None)
        sha256 = sha256_of(data)
        return None if sha256 == ref.sha256 else self.mismatch(ref, data, sha256)

    def size_optional(self, key: str) -> int | None:
        try:
            return int(self.call("size lookup", key, lambda: self.fs.size(self.path(key))))
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        return self.size_optional(key) is not None

    def list_names(self, key: str) -> list[str]:
        """Names of the entries directly under ``key`` (empty if it does not exist)."""
        path = self.path(key)
        try:
            entries = self.call("listing", key, lambda: self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []
        return [posixpath.basename(str(entry).rstrip("/")) for entry in entries]

    def find(self, key: str) -> list[str]:
        """Paths of everything under ``key``: on a disk its files and folders (a folder can
        be empty there: a save that died at once); on S3 its objects, from one listing
        (s3fs looks the key itself up, a lookup and a listing more, when nothing is under
        it, unless the key is passed as a prefix of its parent)."""
        path = self.path(key)
        if self.s3:
            parent, name = posixpath.split(path)
            return self.call("listing", key, lambda: self.fs.find(parent, prefix=f"{name}/"))
        return self.call("listing", key, lambda: self.fs.find(path, withdirs=self.local))

    def delete_tree(self, key: str, first: str | None = None) -> None:
        """Delete everything under ``key``, if anything; the object ``key/first``, if there,
        before the others. On an object store that is one listing and a bulk delete of the
        keys found: asking whether the folder exists and removing it recursively would cost
        a lookup and two more listings."""
        path = self.path(key)
        head = posixpath.join(path, first) if first else None
        try:
            if self.local:
                if self.call("lookup", key, lambda: self.fs.exists(path)):
                    if head is not None:
                        Path(head).unlink(missing_ok=True)
                    self.call("delete", key, lambda: self.fs.rm(path, recursive=True))
                return
            objects = self.find(key)
            if head in objects:
                self.call("delete", key, lambda: self.fs.rm([head]))
                objects.remove(head)
            if objects:
                self.call("delete", key, lambda: self.fs.rm(objects))
        except FileNotFoundError:
            pass


def json_bytes(obj: dict) -> bytes:
    """How the run's JSON objects are stored: indented, keys sorted (diffable by hand)."""
    return json.dumps(obj, indent=2, sort_keys=True).encode()


def sha256_of(data: bytes | mmap.mmap) -> str:
    return hashlib.sha256(data).hexdigest()


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


def _local_atomic_write(path: str, data: bytes) -> None:
    with _temporary_sibling(path) as tmp:
        with open(tmp, "wb") as file:
            file.write(data)
        tmp.replace(path)


def _local_atomic_copy(source: Path, path: str) -> None:
    with _temporary_sibling(path) as tmp:
        shutil.copyfile(source, tmp)
        tmp.replace(path)

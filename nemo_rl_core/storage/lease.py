"""The run's lease: the right to drive a run, exclusive even when runs race for it.

Taking, renewing and giving up the lease are compare-and-swap operations on ``LEASE.json``
with the store's own conditional writes: on S3, ``If-None-Match: *`` to create it and
``If-Match: <etag>`` to replace or delete it; on a local disk, the same checks under an
exclusive ``flock`` of the run's folder. Of N runs racing for one experiment exactly one
wins; the others get ``LeaseHeldError`` naming the holder. A holder whose renewal finds the
lease taken learns it (``lost_to``) and must not commit anything more (``check``).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, Self

from nemo_rl_core.storage.filesystem import OpenedRoot, open_root
from nemo_rl_core.storage.outage import StorageError
from nemo_rl_core.storage.refusal import RunRefusedError
from nemo_rl_core.storage.slow_calls import watching

if TYPE_CHECKING:
    from nemo_rl_core.storage.run_storage import RunStorage

LEASE_KEY = "LEASE.json"


class LeaseHeldError(RunRefusedError):
    """Another live run holds the lease."""


class LeaseLostError(LeaseHeldError):
    """This run's lease was taken by another run: it must stop before its next commit."""


class VersionConflict(Exception):
    """A conditional write lost its race: the object changed (or appeared) meanwhile."""


@dataclass(frozen=True)
class Versioned:
    data: bytes
    version: str


class ConditionalObject(Protocol):
    """One object that is read with its version and written only if that version holds."""

    def read(self) -> Versioned | None: ...

    def create(self, data: bytes) -> str:
        """Write the object if there is none; returns its new version."""
        ...

    def replace(self, data: bytes, version: str) -> str:
        """Write the object if it is still at ``version``; returns its new version."""
        ...

    def delete(self, version: str) -> None: ...


class LocalObject:
    """A file whose reads and writes happen under an exclusive ``flock`` of its folder; its
    version is the sha256 of its bytes."""

    def __init__(self, path: str) -> None:
        self.path = path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _read_unlocked(self) -> Versioned | None:
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        return Versioned(data, hashlib.sha256(data).hexdigest())

    def read(self) -> Versioned | None:
        if not os.path.isdir(os.path.dirname(self.path)):
            return None  # no run folder: nothing to lock, and reading creates nothing
        with self._locked():
            return self._read_unlocked()

    def create(self, data: bytes) -> str:
        with self._locked():
            if self._read_unlocked() is not None:
                raise VersionConflict(self.path)
            return self._write(data)

    def replace(self, data: bytes, version: str) -> str:
        with self._locked():
            current = self._read_unlocked()
            if current is None or current.version != version:
                raise VersionConflict(self.path)
            return self._write(data)

    def delete(self, version: str) -> None:
        with self._locked():
            current = self._read_unlocked()
            if current is None or current.version != version:
                raise VersionConflict(self.path)
            os.unlink(self.path)

    def _write(self, data: bytes) -> str:
        tmp = f"{self.path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, self.path)
        return hashlib.sha256(data).hexdigest()


class S3Object:
    """An S3 object written with S3's conditional requests; its version is its ETag."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.bucket, _, self.key = path.partition("/")

    def _call(self, method: str, **kwargs: Any) -> Any:
        """One S3 request through the filesystem's own ``_call_s3`` (its retries, its
        credentials; s3fs's ``call_s3`` would bind the class's function once, at import)."""
        from fsspec.asyn import sync

        try:
            with watching(method, f"s3://{self.bucket}/{self.key}"):
                return sync(
                    self.fs.loop,
                    self.fs._call_s3,
                    method,
                    Bucket=self.bucket,
                    Key=self.key,
                    **kwargs,
                )
        except FileNotFoundError:
            raise
        except OSError as exc:  # s3fs turns botocore's errors into OSError, the cause kept
            text = f"{exc} {exc.__cause__}"
            if "PreconditionFailed" in text or "ConditionalRequestConflict" in text:
                raise VersionConflict(f"s3://{self.bucket}/{self.key}") from exc
            raise

    def read(self) -> Versioned | None:
        """The object's bytes and ETag from one GET, so the two always belong together."""
        try:
            response = self._call("get_object")
        except FileNotFoundError:
            return None
        return Versioned(_read_body(self.fs, response["Body"]), response["ETag"])

    def create(self, data: bytes) -> str:
        return self._call("put_object", Body=data, IfNoneMatch="*")["ETag"]

    def replace(self, data: bytes, version: str) -> str:
        return self._call("put_object", Body=data, IfMatch=version)["ETag"]

    def delete(self, version: str) -> None:
        self._call("delete_object", IfMatch=version)


def _read_body(fs: Any, body: Any) -> bytes:
    """The bytes of an aiobotocore streaming body, read on s3fs's event loop."""
    from fsspec.asyn import sync

    async def read() -> bytes:
        async with body as stream:
            return await stream.read()

    return sync(fs.loop, read)


class Lease:
    """The right to drive a run until ``expires_at``; renew it before it runs out."""

    def __init__(
        self, storage: "RunStorage", owner: str, ttl_s: float, flow_run_id: str | None = None
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be positive, got {ttl_s}")
        self.storage = storage
        self.owner = owner
        self.ttl_s = ttl_s
        self.flow_run_id = flow_run_id
        self.token = uuid.uuid4().hex
        self.expires_at = 0.0
        self.lost_to: str | None = None
        # The expired record this lease replaced: whose run died without releasing it.
        self.taken_over: dict | None = None
        self._object = storage.lease_object()

    def acquire(self) -> None:
        """Take the lease: create it, or take over an expired one (``LeaseHeldError`` if
        another live run holds it). A lost race re-reads and decides again."""
        while True:
            current = self._object.read()
            record = _record(current)
            held = record if record is not None and record.get("token") != self.token else None
            if held is not None and held["expires_at"] > time.time():
                raise held_error(self.storage.run_id, self.storage.run_url, held)
            with contextlib.suppress(VersionConflict):
                self._write(current)
                self.taken_over = held
                return

    def renew(self) -> None:
        """Extend the lease by ``ttl_s``; ``LeaseLostError`` naming the new holder if another
        run took it (``lost_to`` then says who, and ``check`` refuses further commits)."""
        current = self._object.read()
        record = _record(current)
        if record is None or record.get("token") != self.token:
            self._lose(record)
        try:
            self._write(current)
        except VersionConflict:
            self._lose(_record(self._object.read()))

    def check(self) -> None:
        """Raise ``LeaseLostError`` if a renewal found the lease taken: commit nothing more."""
        if self.lost_to is not None:
            raise LeaseLostError(
                f"run {self.storage.run_url}: this run ({self.owner!r}) lost its lease to "
                f"{self.lost_to!r}; it stops before committing more"
            )

    def release(self) -> None:
        """Give the lease up (only if it is still ours)."""
        current = self._object.read()
        record = _record(current)
        if current is not None and record is not None and record.get("token") == self.token:
            with contextlib.suppress(VersionConflict):  # taken meanwhile: not ours to delete
                self._object.delete(current.version)
        self.expires_at = 0.0
        if self.storage.lease is self:
            self.storage.lease = None

    def _write(self, current: Versioned | None) -> None:
        expires_at = time.time() + self.ttl_s
        record = {"owner": self.owner, "token": self.token, "expires_at": expires_at}
        if self.flow_run_id is not None:
            record["flow_run_id"] = self.flow_run_id
        data = json.dumps(record)
        if current is None:
            self._object.create(data.encode())
        else:
            self._object.replace(data.encode(), current.version)
        self.expires_at = expires_at

    def _lose(self, holder: dict | None) -> None:
        self.lost_to = "nobody (the lease was deleted)" if holder is None else holder.get("owner")
        self.check()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def held_error(
    run_id: str, run_url: str, record: dict, freeing: str | None = None
) -> LeaseHeldError:
    """The refusal of a run whose lease ``record`` another live run holds: who, until when,
    and ``freeing``, how to free a dead holder's lease, if the caller knows a way."""
    expires_at = record["expires_at"]
    until = datetime.fromtimestamp(expires_at, UTC).isoformat(timespec="seconds")
    left = max(0.0, expires_at - time.time())
    flow_run = f", flow run {record['flow_run_id']}" if record.get("flow_run_id") else ""
    return LeaseHeldError(
        f"run {run_id} ({run_url}) is leased by {record.get('owner')!r} until {until} "
        f"(in {left:.0f} s{flow_run}): another run of this experiment drives it, renewing "
        f"the lease while it lives; wait for it to end, or stop it"
        + (f"; {freeing}" if freeing else "")
    )


def lease_object(root: OpenedRoot, run_id: str) -> ConditionalObject:
    """A run's ``LEASE.json`` as an object written only if unchanged (the store's own CAS)."""
    path = f"{root.run_path(run_id)}/{LEASE_KEY}"
    if root.local:
        return LocalObject(path)
    if root.s3:
        return S3Object(root.fs, path)
    raise StorageError(
        f"{root.url}: an exclusive run lease needs file:// or s3:// storage "
        f"(the store's conditional writes), not {root.fs.protocol}"
    )


def live_lease(root: str, run_id: str, storage_options: dict | None = None) -> dict | None:
    """The lease record of run ``run_id`` under ``root`` if a live holder has it (not expired):
    one read, without loading torch and without writing anything, so that a second run of
    an experiment is refused in seconds, before it loads models."""
    record = _record(lease_object(open_root(root, storage_options), run_id).read())
    return record if record is not None and record["expires_at"] > time.time() else None


def read_lease(storage: "RunStorage") -> dict | None:
    """The run's lease record (owner, token, expires_at, flow_run_id), or None."""
    return _record(storage.lease_object().read())


def break_lease(storage: "RunStorage", record: dict) -> bool:
    """Delete the lease if it is still ``record`` (same token): an operator's way out once
    its holder is known to be gone. False if it changed meanwhile (someone renewed or took it)."""
    lease_object = storage.lease_object()
    current = lease_object.read()
    found = _record(current)
    if current is None or found is None or found.get("token") != record.get("token"):
        return False
    try:
        lease_object.delete(current.version)
    except VersionConflict:
        return False
    return True


def _record(current: Versioned | None) -> dict | None:
    return None if current is None else json.loads(current.data)

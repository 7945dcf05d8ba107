"""How a storage root is opened: the fsspec file system with the options every run's
storage uses (no listing cache where other processes write; fast-failing S3 clients whose
retries the outage budget makes). Light to import: the lease check of the command line
reads ``LEASE.json`` through it before torch loads."""

import posixpath
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from nemo_rl_core.storage.outage import S3_FAST_FAIL, S3_TRIES, StorageError


@dataclass(frozen=True)
class OpenedRoot:
    """A storage root: its URL, its file system and the root's path inside it."""

    url: str
    fs: Any
    path: str
    s3: bool
    local: bool

    def run_path(self, run_id: str) -> str:
        return posixpath.join(self.path.rstrip("/"), "runs", run_id)

    def run_url(self, run_id: str) -> str:
        return f"{self.url}/runs/{run_id}"


def open_root(root: str, storage_options: dict | None) -> OpenedRoot:
    """The file system of ``root`` (any fsspec URL), ``StorageError`` if it cannot open."""
    url = str(root).rstrip("/") or "/"
    options = dict(storage_options or {})
    protocol = fsspec.utils.get_protocol(url)
    if protocol not in ("file", "local"):
        # Other writers (stages in other processes) change the run: never trust a listing.
        options.setdefault("use_listings_cache", False)
    s3 = protocol in ("s3", "s3a")
    if s3:
        for name, value in S3_FAST_FAIL.items():
            options.setdefault(name, value)
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ValueError, ImportError, TypeError) as exc:
        raise StorageError(f"cannot open storage root {url!r}: {exc}") from exc
    if s3:
        fs.retries = S3_TRIES
    return OpenedRoot(url, fs, path, s3, isinstance(fs, LocalFileSystem))

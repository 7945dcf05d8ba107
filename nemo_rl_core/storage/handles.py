"""Which run a stage works on, and this process's storage handle for it.

A :class:`RunRef` is what travels between flows, tasks and machines: small, serializable
and free of credentials. Credentials stay in the process that was given them
(:func:`use_storage_options`) or come from the environment.
"""

from dataclasses import dataclass
from typing import Any

from nemo_rl_core.storage.run_storage import RunStorage, validate_name


@dataclass(frozen=True)
class RunRef:
    """A run: the storage root it lives under and its id."""

    storage_root: str
    run_id: str

    def __post_init__(self) -> None:
        validate_name("run_id", self.run_id)


_storages: dict[RunRef, RunStorage] = {}
_storage_options: dict[str, dict[str, Any]] = {}


def use_storage_options(storage_root: str, options: dict[str, Any]) -> None:
    """fsspec options (credentials, endpoint) for a root, kept in this process only: task
    parameters are stored and shown by Prefect, so secrets never travel in a RunRef."""
    _storage_options[storage_root] = options
    for run in [r for r in _storages if r.storage_root == storage_root]:
        del _storages[run]


def open_storage(run: RunRef) -> RunStorage:
    """The process's storage handle for ``run``; credentials come from
    :func:`use_storage_options` or the environment (``AWS_*``, ``AWS_ENDPOINT_URL_S3``)."""
    if run not in _storages:
        options = _storage_options.get(run.storage_root)
        _storages[run] = RunStorage(run.storage_root, run.run_id, storage_options=options)
    return _storages[run]

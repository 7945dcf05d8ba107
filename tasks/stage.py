"""Run one stage of one iteration at most once per inputs; the run's manifest decides.

Every stage task goes through ``run_stage``: if the manifest already holds a complete
entry for the same inputs, its stored outputs are returned and nothing is recomputed
(a failed flow run, run again with the same run_id, continues at the failed stage);
otherwise the stage computes, writes each output atomically and records it.
"""

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.run_storage import (
    IntegrityError,
    ObjectRef,
    RunStorage,
    StorageError,
    validate_name,
)

FAULT_ENV = "NEMO_RL_CORE_FAULT"
StageOutputs = dict[str, dict[str, Any]]


class InjectedFault(RuntimeError):
    """Raised where ``NEMO_RL_CORE_FAULT`` asks for a failure (fault-injection tests)."""


@dataclass(frozen=True)
class RunRef:
    """What tasks need to find a run: small, serializable, free of credentials."""

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
    """The process's storage handle for ``run``; credentials come from a Prefect block
    (``use_storage_options``) or the environment (``AWS_*``, ``AWS_ENDPOINT_URL_S3``)."""
    if run not in _storages:
        options = _storage_options.get(run.storage_root)
        _storages[run] = RunStorage(run.storage_root, run.run_id, storage_options=options)
    return _storages[run]


def stage_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("nemo_rl_core.stage")


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry storage/worker outages, never deterministic errors."""
    exc = state.data
    if isinstance(exc, IntegrityError):
        return False
    return isinstance(exc, StorageError | ConnectionError | TimeoutError)


def _maybe_inject_fault(stage: str, iteration: int, point: str) -> None:
    """``NEMO_RL_CORE_FAULT=stage@iteration[:kill]``: fail (or SIGKILL the process) there.

    ``raise`` faults fire before the stage computes; ``kill`` faults fire after it computed
    but before its outputs are committed, like a worker lost in the middle of a stage.
    """
    spec = os.environ.get(FAULT_ENV, "")
    for item in filter(None, spec.split(",")):
        target, _, mode = item.partition(":")
        mode = mode or "raise"
        if target != f"{stage}@{iteration}":
            continue
        if mode == "raise" and point == "before":
            raise InjectedFault(f"fault injected into stage {stage!r} of iteration {iteration}")
        if mode == "kill" and point == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)


def run_stage(
    run: RunRef,
    iteration: int,
    stage: str,
    inputs: dict[str, str],
    compute: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
) -> StageOutputs:
    """Return the stage's output refs, computing them only if the manifest lacks them.

    ``inputs`` maps input names to content digests (checksums of upstream outputs, the
    config digest, the weights version). ``compute`` returns ``(outputs, metrics)`` where
    each output is a BatchedDataDict (stored as Parquet) or a dict (stored as JSON).
    """
    storage = open_storage(run)
    log = stage_logger()
    entry = storage.completed_stage(iteration, stage, inputs)
    if entry is not None:
        log.info(
            "run %s iteration %d stage %s: complete with these inputs, skipped",
            run.run_id,
            iteration,
            stage,
        )
        return entry["outputs"]
    _maybe_inject_fault(stage, iteration, "before")
    log.info("run %s iteration %d stage %s: running", run.run_id, iteration, stage)
    started = time.perf_counter()
    outputs, metrics = compute()
    metrics = {**metrics, "seconds": time.perf_counter() - started}
    _maybe_inject_fault(stage, iteration, "before_commit")
    refs: dict[str, ObjectRef] = {}
    for name, value in outputs.items():
        if isinstance(value, BatchedDataDict):
            refs[name] = storage.write_batch(iteration, stage, value, name=name)
        elif isinstance(value, dict):
            refs[name] = storage.write_json(iteration, stage, name, value)
        else:
            raise TypeError(f"stage {stage!r} output {name!r} is a {type(value).__name__}")
    entry = storage.record_stage(iteration, stage, inputs, refs, metrics)
    log.info(
        "run %s iteration %d stage %s: committed %s", run.run_id, iteration, stage, sorted(refs)
    )
    return entry["outputs"]


def read_output_batch(run: RunRef, outputs: StageOutputs, name: str = "batch") -> BatchedDataDict:
    return open_storage(run).read_batch(ObjectRef.from_dict(outputs[name]))


def read_output_json(run: RunRef, outputs: StageOutputs, name: str) -> dict[str, Any]:
    return open_storage(run).read_json(ObjectRef.from_dict(outputs[name]))


def digest_of(outputs: StageOutputs, name: str = "batch") -> str:
    return outputs[name]["sha256"]

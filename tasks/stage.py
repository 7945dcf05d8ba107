"""Run one stage of one iteration at most once per inputs; the run's manifest decides.

Every stage task goes through ``run_stage``: if the manifest already holds a complete
entry for the same inputs, its stored outputs are returned and nothing is recomputed
(a failed flow run, run again with the same run_id, continues at the failed stage);
otherwise the stage computes, writes each output atomically and records it.
"""

import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import psutil
from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
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
T = TypeVar("T")
P = ParamSpec("P")
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


def stage_task(name: str) -> Callable[[Callable[P, T]], Task[P, T]]:
    """The Prefect task options every stage shares.

    Retries only for transient storage or worker outages. No Prefect cache and no result
    persistence: the run's manifest already decides what is done (``run_stage``), and
    Prefect's default cache policy hashes every call's inputs and the task's source and
    looks for a stored result, ~8 ms per task run for nothing (bench/RESULTS.md, issue 8).
    """
    return task(
        name=name,
        retries=2,
        retry_delay_seconds=[2, 10],
        retry_condition_fn=is_transient,
        cache_policy=NO_CACHE,
        persist_result=False,
    )


def injected_faults(stage: str, iteration: int) -> set[str]:
    """The modes ``NEMO_RL_CORE_FAULT=stage@iteration[:mode],...`` asks of this stage.

    ``raise`` (the default) fails before the stage computes; ``kill`` SIGKILLs the process
    (with its children) after it computed but before its outputs are committed, like a worker lost in the
    middle of a stage; ``damage`` flips one byte of each committed output (once per
    process), so the next stage reads an object that no longer matches the manifest.
    """
    spec = os.environ.get(FAULT_ENV, "")
    modes = set()
    for item in filter(None, spec.split(",")):
        target, _, mode = item.partition(":")
        if target == f"{stage}@{iteration}":
            modes.add(mode or "raise")
    return modes


def _kill_process_tree() -> None:
    """SIGKILL this process and everything it started (forked reward workers), as a lost
    machine takes them along: a surviving child would hold the worker's pipe to this
    process open, and Prefect would see the crash only when that child exits."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    os.kill(os.getpid(), signal.SIGKILL)


_damaged: set[tuple[str, int]] = set()


def _damage_once(
    storage: RunStorage, stage: str, iteration: int, refs: dict[str, ObjectRef]
) -> None:
    """Overwrite each output with one byte flipped, size unchanged, behind the manifest's
    back (what a bad disk or a partial overwrite does); the re-executed stage is spared."""
    if (stage, iteration) in _damaged:
        return
    _damaged.add((stage, iteration))
    for ref in refs.values():
        data = bytearray(storage._get_optional(ref.key) or b"")
        data[len(data) // 2] ^= 0xFF
        storage._put(ref.key, bytes(data))
    stage_logger().warning("fault injected: damaged %s", sorted(r.key for r in refs.values()))


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
    each output is a BatchedDataDict (stored as an Arrow IPC batch) or a dict (stored as JSON).
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
    faults = injected_faults(stage, iteration)
    if "raise" in faults:
        raise InjectedFault(f"fault injected into stage {stage!r} of iteration {iteration}")
    log.info("run %s iteration %d stage %s: running", run.run_id, iteration, stage)
    started = time.perf_counter()
    outputs, metrics = compute()
    metrics = {**metrics, "seconds": time.perf_counter() - started}
    if "kill" in faults:
        _kill_process_tree()
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
    if "damage" in faults:
        _damage_once(storage, stage, iteration, refs)
    return entry["outputs"]


_STAGE_KEY_RE = re.compile(r"iter_(?P<iteration>\d+)/(?P<stage>[^/]+)/[^/]+")


class DamagedInputError(IntegrityError):
    """A stage input does not match its manifest entry (size, sha256, missing): names the
    object and the stage and iteration that produced it, which the flow re-executes."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(key, detail)
        self.key, self.detail = key, detail
        match = _STAGE_KEY_RE.fullmatch(key)
        if match is None:
            raise ValueError(f"{key!r} is not a stage output key (iter_<n>/<stage>/<name>)")
        self.iteration, self.stage = int(match["iteration"]), match["stage"]

    def __str__(self) -> str:
        return (
            f"input {self.key} (output of stage {self.stage!r} of iteration {self.iteration}) "
            f"is damaged: {self.detail}"
        )


def _read_input(outputs: StageOutputs, name: str, read: Callable[[ObjectRef], T]) -> T:
    ref = ObjectRef.from_dict(outputs[name])
    try:
        return read(ref)
    except IntegrityError as err:
        raise DamagedInputError(ref.key, str(err)) from err


def read_output_batch(run: RunRef, outputs: StageOutputs, name: str = "batch") -> BatchedDataDict:
    """An upstream stage's batch; ``DamagedInputError`` if it no longer matches its entry."""
    return _read_input(outputs, name, open_storage(run).read_batch)


def read_output_json(run: RunRef, outputs: StageOutputs, name: str) -> dict[str, Any]:
    return _read_input(outputs, name, open_storage(run).read_json)


def digest_of(outputs: StageOutputs, name: str = "batch") -> str:
    return outputs[name]["sha256"]

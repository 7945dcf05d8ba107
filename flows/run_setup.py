"""What every training flow does before its first stage: validate the config, find or
create the run on storage, refuse a resume that changed the model or data, and decide
which iterations this flow run covers."""

import datetime as dt
import os
import secrets
import socket
from typing import Any

from flows.config_check import check_run_config, trained_models
from flows.lost_progress import START_OVER, check_progress_survives
from flows.placed_nodes import warn_if_pool_is_short
from flows.placement import check_placement
from flows.storage_block import load_storage_block
from nemo_rl_core.data.datasets.builder import dataset_environments, games_from_environment
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.pipeline.runtime import runtime_for
from nemo_rl_core.pipeline.spec import Pipeline, declared
from nemo_rl_core.pipeline.stage_keys import check_stage_names
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import RunStorage
from nemo_rl_core.utils.config import ConfigError
from tasks.stage import stage_logger


def new_run_id(prefix: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"


def _pick(config: dict, dotted: str) -> object:
    node: Any = config
    for key in dotted.split("."):
        node = node.get(key, {}) if isinstance(node, dict) else {}
    return node


def _set_values(node: object) -> object:
    """``node`` without its null entries: a key a newer release adds, unset (null), changes
    nothing a run trained with, so a run started before it still resumes."""
    if isinstance(node, dict):
        return {key: _set_values(value) for key, value in node.items() if value is not None}
    if isinstance(node, list):
        return [_set_values(value) for value in node]
    return node


def check_same_identity(pipeline: Pipeline, stored: dict, new: dict, run_id: str) -> None:
    """A resume must train the same model on the same data as the run it continues."""
    for key in pipeline.identity_keys:
        if _set_values(_pick(stored, key)) != _set_values(_pick(new, key)):
            raise ConfigError(
                f"run {run_id!r} was started with a different {key} "
                f"({_pick(stored, key)!r} != {_pick(new, key)!r}); start a new run_id "
                "or restore the original value"
            )


def first_iteration(pipeline: Pipeline, storage: RunStorage) -> int:
    """Where to continue: the newest committed checkpoint, or an earlier iteration whose
    stages were marked stale by a rerun (they must be recomputed first)."""
    latest = storage.latest_checkpoint() or 0
    iterations = storage.iterations()
    for iteration in iterations:
        if iteration < latest and storage.read_manifest(iteration).stale_stages():
            return iteration
    # Killed after the committing stage wrote checkpoint ``latest`` but before the iteration
    # finished: finish it (the committing stage recomputes from the checkpoint before,
    # bit-equal, and the stages after it run).
    previous = latest - 1
    if previous in iterations and (previous == 0 or storage.is_committed(previous)):
        final = pipeline.stages[-1].name
        if storage.read_manifest(previous).complete(final) is None:
            return previous
    return latest


def open_run(
    pipeline: Pipeline,
    config_path: str,
    overrides: list[str] | None,
    run_id: str | None,
    storage_root: str | None,
    storage_block: str | None = None,
) -> tuple[RunRef, Any]:
    """Validate the config and name the run; nothing of the run is written yet and no model
    is built (``build_models``, once the run's lease is held)."""
    setup = declared(pipeline, "data_setup")
    config = check_run_config(pipeline.config_class, config_path, overrides, setup)
    check_stage_names(config, pipeline)
    check_placement(config, pipeline)
    warn_if_pool_is_short(config)
    root = storage_root or config.checkpointing.checkpoint_dir
    load_storage_block(root, storage_block)
    return RunRef(root, run_id or new_run_id(pipeline.name)), config


def build_models(pipeline: Pipeline, config: Any) -> None:
    """Under the lease: build the config's built-in models (the warm-started one takes a
    minute or two, which no stage's timeout should pay) and run the pipeline's
    ``preflight`` checks of them. After the lease, so that a second run of an experiment is
    refused before it loads or builds anything."""
    for _, model in trained_models(config):
        resolve_model(model.model_name)
    if pipeline.preflight is not None:
        pipeline.preflight(config)


def config_notes(config: Any) -> list[str]:
    """What the run does that a key of its config could lead one to expect otherwise, said
    once in the flow run's log: keys NeMo RL would not read here."""
    notes = []
    if not config.checkpointing.enabled:
        notes.append(
            "checkpointing.enabled is false: each iteration still commits the weights the next "
            "one starts from, and only the newest checkpoint is kept (what continuing the run "
            "needs); keep_top_k, save_period and metric_name are not read"
        )
    env = getattr(config, "env", {})
    unread = sorted(set(env) - dataset_environments(config.data, env))
    if unread:
        sections = ", ".join(f"env.{name}" for name in unread)
        notes.append(
            f"{sections}: not read, as in NeMo RL, which builds only the environments the "
            "datasets name (their env_name)"
        )
    if config.data.val_data_paths and config.data.validation:
        notes.append(
            "data.validation: not read, as in NeMo RL, whose DPO and reward-model runs "
            "validate on the sets data.val_data_paths names instead"
        )
    if games_from_environment(config.data, env):
        notes.append(
            "data.train and data.validation are not read: env.sliding_puzzle_game sets up the "
            "games to train and validate on, as NeMo RL's puzzle runner does (a dataset whose "
            "env_name is sliding_puzzle_game would be read instead)"
        )
    return notes


def plan_iterations(
    pipeline: Pipeline,
    run: RunRef,
    config: Any,
    steps_per_run: int | None,
    start_over: bool = False,
) -> tuple[list[int], int]:
    """Under the lease: check that the run's stored progress survives (``start_over``:
    discard it), that a resume keeps its model and data, store the resolved config, and
    return the iterations this flow run covers and the run's final training step."""
    log = stage_logger()
    if start_over:
        iterations, steps = open_storage(run).discard_progress()
        log.warning(
            "run %s: starting over (%s): deleted %d stored iteration(s) and committed "
            "checkpoint(s) %s; training from iteration 0",
            run.run_id,
            START_OVER,
            len(iterations),
            steps or "none",
        )
    else:
        for note in check_progress_survives(pipeline, run, open_storage(run)):
            log.warning(note)
    storage = store_run_config(pipeline, run, config, keep_identity=not start_over)
    final_step = runtime_for(run).final_step()
    start = first_iteration(pipeline, storage)
    end = pipeline.last_iteration(config, final_step)
    if steps_per_run is not None:
        if steps_per_run < 1:
            raise ConfigError(f"steps_per_run must be >= 1, got {steps_per_run}")
        end = min(end, start + steps_per_run)
    return list(range(start, end)), final_step


def store_run_config(
    pipeline: Pipeline, run: RunRef, config: Any, keep_identity: bool = True
) -> RunStorage:
    """Under the lease: check a resume keeps the identity keys of the run it continues
    (``keep_identity``; not for a run started over), then store the resolved config (what
    every stage of the run reads)."""
    storage = open_storage(run)
    resolved = config.model_dump(mode="json")
    stored = storage.read_run_config()
    if stored is not None and keep_identity:
        check_same_identity(pipeline, stored, resolved, run.run_id)
    storage.write_run_config(resolved, allow_change=True)
    return storage


def lease_owner() -> str:
    """Who holds the lease: the Prefect flow run if there is one, else host and pid."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = f" flow-run {context.flow_run.id}" if context and context.flow_run else ""
    return f"{socket.gethostname()} pid {os.getpid()}{flow_run}"

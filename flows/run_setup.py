"""What every training flow does before its first stage: validate the config, find or
create the run on storage, refuse a resume that changed the model or data, and decide
which iterations this flow run covers."""

import datetime as dt
import os
import secrets
import socket

from nemo_rl_core.algorithms.grpo import MasterConfig, RLMasterConfig, load_master_config
from nemo_rl_core.algorithms.ppo import PPOMasterConfig
from nemo_rl_core.data.datasets.builder import load_rows
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.storage.run_storage import RunStorage
from nemo_rl_core.utils.config import ConfigError
from tasks.stage import RunRef, open_storage, use_storage_options

# A resume must train the same model on the same data as the run it continues.
IDENTITY_KEYS = (
    ("policy", "model_name"),
    ("value", "model_name"),
    ("data",),
    ("grpo", "seed"),
    ("ppo", "seed"),
)
# Each flow validates its YAML into its algorithm's master config.
CONFIG_CLASSES: dict[str, type[RLMasterConfig]] = {"grpo": MasterConfig, "ppo": PPOMasterConfig}


def new_run_id(prefix: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"


def _pick(config: dict, path: tuple[str, ...]) -> object:
    for key in path:
        config = config.get(key, {}) if isinstance(config, dict) else {}
    return config


def check_same_identity(stored: dict, new: dict, run_id: str) -> None:
    for path in IDENTITY_KEYS:
        if _pick(stored, path) != _pick(new, path):
            key = ".".join(path)
            raise ConfigError(
                f"run {run_id!r} was started with a different {key} "
                f"({_pick(stored, path)!r} != {_pick(new, path)!r}); start a new run_id "
                "or restore the original value"
            )


def first_iteration(storage: RunStorage) -> int:
    """Where to continue: the newest committed checkpoint, or an earlier iteration whose
    stages were marked stale by a rerun (they must be recomputed first)."""
    latest = storage.latest_checkpoint() or 0
    iterations = storage.iterations()
    for iteration in iterations:
        if iteration < latest:
            stages = storage.read_manifest(iteration).get("stages", {})
            if any(entry.get("status") == "stale" for entry in stages.values()):
                return iteration
    # Killed after train committed checkpoint ``latest`` but before the iteration recorded
    # it: finish that iteration (train is recomputed from the checkpoint before, bit-equal).
    previous = latest - 1
    if previous in iterations and (previous == 0 or previous in storage.committed_checkpoints()):
        checkpoint_stage = storage.read_manifest(previous)["stages"].get("checkpoint", {})
        if checkpoint_stage.get("status") != "complete":
            return previous
    return latest


def open_run(
    config_path: str,
    overrides: list[str] | None,
    run_id: str | None,
    storage_root: str | None,
    algorithm: str,
    storage_block: str | None = None,
) -> tuple[RunRef, RLMasterConfig]:
    """Validate the config and name the run; nothing is written yet (no lease is held)."""
    config = load_master_config(config_path, overrides, CONFIG_CLASSES[algorithm])
    root = storage_root or config.checkpointing.checkpoint_dir
    if not config.checkpointing.enabled:
        raise ConfigError(
            "checkpointing.enabled=false: stages hand weights to the next iteration through "
            "checkpoints, so a staged run needs checkpointing enabled"
        )
    # A missing model directory or a bad data row fails here, before the run is written.
    resolve_model(config.policy.model_name)
    load_rows(config.data)
    load_storage_block(root, storage_block)
    return RunRef(root, run_id or new_run_id(algorithm)), config


def plan_iterations(run: RunRef, config: RLMasterConfig, steps_per_run: int | None) -> list[int]:
    """Under the lease: check a resume keeps its model and data, store the resolved config,
    and return the iterations this flow run covers."""
    storage = open_storage(run)
    resolved = config.model_dump(mode="json")
    stored = storage.read_run_config()
    if stored is not None:
        check_same_identity(stored, resolved, run.run_id)
    storage.write_run_config(resolved, allow_change=True)
    start = first_iteration(storage)
    end = config.algorithm_max_steps()
    if steps_per_run is not None:
        if steps_per_run < 1:
            raise ConfigError(f"steps_per_run must be >= 1, got {steps_per_run}")
        end = min(end, start + steps_per_run)
    return list(range(start, end))


def load_storage_block(storage_root: str, block_name: str | None) -> None:
    """Use the credentials of a prefect-aws ``AwsCredentials`` block for ``storage_root``."""
    if block_name is None:
        return
    from prefect_aws import AwsCredentials

    credentials = AwsCredentials.load(block_name)
    options: dict = {
        "key": credentials.aws_access_key_id,
        "secret": credentials.aws_secret_access_key.get_secret_value(),
    }
    endpoint = credentials.aws_client_parameters.endpoint_url
    if endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    use_storage_options(storage_root, options)


def lease_owner() -> str:
    """Who holds the lease: the Prefect flow run if there is one, else host and pid."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = f" flow-run {context.flow_run.id}" if context and context.flow_run else ""
    return f"{socket.gethostname()} pid {os.getpid()}{flow_run}"

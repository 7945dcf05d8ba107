"""NeMo RL's ``logger:`` section: which loggers a run writes to and how (the logger itself
is :mod:`nemo_rl_core.utils.logger`'s). A logger whose package is not installed is refused
when turned on, before any work.
"""

import importlib.util
import shutil
from typing import Annotated

from pydantic import Field

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.utils.key_support import Check, Only, PartOf, SupportContext, Wired, inert

_LOGGER = "nemo_rl_core.utils.logger"


def _missing_package(package: str, key: str, enabled: bool) -> str | None:
    if enabled and importlib.util.find_spec(package) is None:
        return f"{key} needs the {package} package, which is not installed"
    return None


def _needs_package(package: str, key: str) -> Check:
    """Refuse turning a logger on when its package is not installed."""
    return Check(
        lambda enabled, _: _missing_package(package, key, enabled),
        f"works where the {package} package is installed",
    )


def _local_mlflow_store(enabled: bool, context: SupportContext) -> str | None:
    uri = context.value("logger.mlflow.tracking_uri")
    if enabled and uri is not None and not str(uri).startswith(("sqlite:", "file:")):
        return (
            f"logger.mlflow.tracking_uri={uri!r} names a tracking server; this deployment "
            "logs to a local store only (leave it unset for <log_dir>/<run_id>/mlflow.db, "
            "or give a sqlite: or file: URI)"
        )
    return _missing_package("mlflow", "logger.mlflow_enabled", enabled)


def _gpus_to_monitor(enabled: bool, context: SupportContext) -> str | None:
    if not enabled:
        return None
    if context.machine.cuda_devices == 0:
        return None  # no GPU to sample: the monitor does not start (said in the run's log)
    if shutil.which("nvidia-smi") is None:
        return "GPU monitoring reads nvidia-smi, which is not on PATH"
    return None


class WandbConfig(StrictConfig):
    """``logger.wandb``: passed to ``wandb.init`` (offline; ``name`` defaults to the run id)."""

    project: Annotated[str | None, PartOf("logger.wandb_enabled")] = None
    name: Annotated[str | None, PartOf("logger.wandb_enabled")] = None
    entity: Annotated[str | None, PartOf("logger.wandb_enabled")] = None


class SwanlabConfig(StrictConfig):
    project: Annotated[str | None, PartOf("logger.swanlab_enabled")] = None
    name: Annotated[str | None, PartOf("logger.swanlab_enabled")] = None


class TensorboardConfig(StrictConfig):
    """``logger.tensorboard``: NeMo RL's configs name a ``log_dir`` (``tb_logs-dpo-dev``)."""

    log_dir: Annotated[
        str | None,
        inert(
            "NeMo RL v0.7 reads it nowhere: its TensorBoard writer logs to "
            "<logger.log_dir>/tensorboard, as the one here does (in the run's log folder)",
        ),
    ] = None


class MLflowConfig(StrictConfig):
    """``logger.mlflow``: ``run_id`` continues that MLflow run; otherwise the run tagged with
    this run's id continues, or a new one named ``run_name`` (default: the run id) starts."""

    experiment_name: Annotated[str | None, PartOf("logger.mlflow_enabled")] = None
    run_id: Annotated[str | None, PartOf("logger.mlflow_enabled")] = None
    run_name: Annotated[str | None, PartOf("logger.mlflow_enabled")] = None
    tracking_uri: Annotated[str | None, PartOf("logger.mlflow_enabled")] = None
    artifact_location: Annotated[str | None, PartOf("logger.mlflow_enabled")] = None


class GPUMonitoringConfig(StrictConfig):
    collection_interval: Annotated[float, Field(gt=0), PartOf("logger.monitor_gpus")] = 10
    flush_interval: Annotated[float, Field(gt=0), PartOf("logger.monitor_gpus")] = 10


class LoggerConfig(StrictConfig):
    """NeMo RL's ``logger:`` keys."""

    log_dir: Annotated[str, Wired(f"{_LOGGER}:run_log_dir")] = "logs"
    num_val_samples_to_print: Annotated[
        int, Field(ge=0), Wired("nemo_rl_core.experience.rollout_table:format_samples")
    ] = 0
    wandb_enabled: Annotated[bool, _needs_package("wandb", "logger.wandb_enabled")] = False
    tensorboard_enabled: Annotated[
        bool, _needs_package("tensorboard", "logger.tensorboard_enabled")
    ] = False
    mlflow_enabled: Annotated[
        bool, Check(_local_mlflow_store, "a local MLflow store, where mlflow is installed")
    ] = False
    swanlab_enabled: Annotated[
        bool,
        Only(
            False,
            reason="SwanLab logging is not built in this deployment (its package is not "
            "installed); use tensorboard_enabled, mlflow_enabled or wandb_enabled",
        ),
    ] = False
    monitor_gpus: Annotated[
        bool,
        Check(
            _gpus_to_monitor, "samples the GPUs through nvidia-smi; none here: nothing to sample"
        ),
    ] = False
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    swanlab: SwanlabConfig = Field(default_factory=SwanlabConfig)
    tensorboard: TensorboardConfig = Field(default_factory=TensorboardConfig)
    mlflow: MLflowConfig = Field(default_factory=MLflowConfig)
    gpu_monitoring: GPUMonitoringConfig = Field(default_factory=GPUMonitoringConfig)

"""NeMo RL's ``logger:`` section and a metrics logger.

Metrics always go to ``<log_dir>/metrics.jsonl`` (one line per step and prefix) so a run
can be inspected without any service; TensorBoard and MLflow are optional backends,
enabled by the same keys as NeMo RL's (``tensorboard_enabled``, ``mlflow_enabled``).
"""

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class LoggerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log_dir: str = "logs"
    num_val_samples_to_print: int = 0
    wandb_enabled: bool = False
    tensorboard_enabled: bool = False
    mlflow_enabled: bool = False
    swanlab_enabled: bool = False
    monitor_gpus: bool = False
    wandb: dict[str, Any] = Field(default_factory=dict)
    tensorboard: dict[str, Any] = Field(default_factory=dict)
    mlflow: dict[str, Any] = Field(default_factory=dict)
    gpu_monitoring: dict[str, Any] = Field(default_factory=dict)


def _scalars(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """Flatten to ``prefix/key`` -> finite-or-not float; non-numeric values are skipped."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else key
        if isinstance(value, dict):
            flat.update(_scalars(value, name))
        elif isinstance(value, bool | int | float):
            flat[name] = float(value)
        elif hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
            flat[name] = float(value.item())
    return flat


class Logger:
    """Writes step metrics to JSONL and to the optional backends the config enables."""

    def __init__(self, config: LoggerConfig, run_name: str = "run") -> None:
        self.config = config
        self.log_dir = Path(config.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = self.log_dir / "metrics.jsonl"
        self._tensorboard = None
        self._mlflow = None
        if config.wandb_enabled or config.swanlab_enabled:
            raise ValueError(
                "logger.wandb_enabled / logger.swanlab_enabled need a hosted service, which this "
                "deployment does not reach; use logger.tensorboard_enabled or logger.mlflow_enabled"
            )
        if config.tensorboard_enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(self.log_dir / "tensorboard" / run_name))
        if config.mlflow_enabled:
            import mlflow

            mlflow.set_tracking_uri(
                config.mlflow.get("tracking_uri", f"file:{self.log_dir}/mlruns")
            )
            mlflow.set_experiment(config.mlflow.get("experiment_name", "nemo-rl-core"))
            self._mlflow = mlflow
            mlflow.start_run(run_name=config.mlflow.get("run_name", run_name))

    def log_metrics(self, metrics: dict[str, Any], step: int, prefix: str = "") -> None:
        scalars = _scalars(metrics, prefix)
        record = {
            "step": step,
            **{k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()},
        }
        with self._jsonl.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._mlflow is not None:
            self._mlflow.log_metrics(
                {k.replace("/", "."): v for k, v in scalars.items() if math.isfinite(v)}, step=step
            )

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._mlflow is not None:
            self._mlflow.end_run()

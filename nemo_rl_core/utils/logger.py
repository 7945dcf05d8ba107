"""The metrics logger of a run (NeMo RL's ``logger:`` section is
:mod:`nemo_rl_core.config.logger`'s, importable here by NeMo RL's paths).

Each run logs into one folder of its own, ``<log_dir>/<run_id>/`` (NeMo RL's runners log
into ``<log_dir>/exp_<n>/``), and never to the network; the backends' folders inside it
are NeMo RL's:

    metrics.jsonl     always: one record per ``log_metrics`` call, with the run id and step
    tensorboard/      TensorBoard event files (``tensorboard_enabled``)
    mlflow/           the artifacts of an MLflow experiment created here (``mlflow_enabled``)
    mlflow.db         MLflow's local SQLite store unless ``tracking_uri`` names one (MLflow 3
                      keeps its plain-file store in maintenance mode, ``file:...`` still
                      selects it)
    wandb/wandb/      a W&B offline run (``wandb_enabled``, W&B's ``dir`` is ``wandb/``), for
                      ``wandb sync`` later

Metric names are NeMo RL's: ``prefix/name`` (``train/loss``, ``validation/accuracy``).
"""

import json
import math
import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# NeMo RL's paths of the section's classes (nemo_rl.utils.logger.LoggerConfig, ...).
from nemo_rl_core.config.logger import (  # noqa: F401
    GPUMonitoringConfig,
    LoggerConfig,
    MLflowConfig,
    SwanlabConfig,
    TensorboardConfig,
    WandbConfig,
)
from nemo_rl_core.utils.gpu_monitor import GpuMonitor
from nemo_rl_core.utils.key_support import Machine

EXPERIMENT_DIR = re.compile(r"exp_(\d+)")


def run_log_dir(config: LoggerConfig, run_id: str) -> Path:
    """The run's log folder: ``<log_dir>/<run_id>``."""
    return Path(config.log_dir) / run_id


def get_next_experiment_dir(base_log_dir: str) -> str:
    """NeMo RL's experiment folder for a script's run: ``<base_log_dir>/exp_<n>`` (three
    digits), one past the highest there, created here. Two runs starting together get two
    folders: the creation is the claim, and a taken number moves on to the next."""
    base = Path(base_log_dir)
    base.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in base.iterdir() if (m := EXPERIMENT_DIR.fullmatch(p.name))]
    number = max(taken, default=0) + 1
    while True:
        folder = base / f"exp_{number:03d}"
        try:
            folder.mkdir()
        except FileExistsError:
            number += 1
            continue
        return str(folder)


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """``prefix/key`` -> float for every number (nested dicts joined with ``/``; one-element
    tensors and arrays taken as numbers); other values are left out."""
    flat = flatten_dict({prefix: metrics} if prefix else metrics, sep="/", expand_lists=False)
    return {name: number for name, value in flat.items() if (number := _number(value)) is not None}


def _number(value: Any) -> float | None:
    if isinstance(value, bool | int | float):
        return float(value)
    if hasattr(value, "item"):  # tensors and arrays of one element
        try:
            return float(value.item())
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


class JsonlBackend:
    """``metrics.jsonl``: readable without any service; non-finite numbers as strings."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path, self.run_id = path, run_id

    def log_metrics(self, scalars: dict[str, float], step: int, step_metric: str | None) -> None:
        values = {k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()}
        with self.path.open("a") as handle:
            handle.write(json.dumps({"run_id": self.run_id, "step": step, **values}) + "\n")

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """The config is in run storage (``config.yaml``); the JSONL holds metrics only."""

    def close(self) -> None:
        """Each record is written and closed at once."""


class TensorBoardBackend:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log_metrics(self, scalars: dict[str, float], step: int, step_metric: str | None) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        # add_hparams would start a sub-run per call; the config as text stays with the run.
        self.writer.add_text("config", f"```\n{json.dumps(params, indent=1, default=str)}\n```")

    def close(self) -> None:
        self.writer.close()


class MLflowBackend:
    """One MLflow run per run id, continued when a flow run resumes it."""

    RUN_ID_TAG = "nemo_rl_core.run_id"

    def __init__(self, config: MLflowConfig, run_dir: Path, run_id: str) -> None:
        uri = config.tracking_uri or f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
        if uri.startswith("file:"):  # asked for by name: MLflow 3 wants the opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric, self._param = Metric, Param
        self.client = MlflowClient(tracking_uri=uri)
        self.continued = True
        self.mlflow_run_id = config.run_id or self._tagged_run(config, run_dir, run_id)

    def _tagged_run(self, config: MLflowConfig, run_dir: Path, run_id: str) -> str:
        experiment_id = "0"  # MLflow's default experiment, as NeMo RL uses without a name
        if config.experiment_name is not None:
            found = self.client.get_experiment_by_name(config.experiment_name)
            # NeMo RL's: the experiment's artifacts default to <log folder>/mlflow
            location = config.artifact_location or str(run_dir.resolve() / "mlflow")
            experiment_id = (
                found.experiment_id
                if found
                else self.client.create_experiment(config.experiment_name, location)
            )
        runs = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{self.RUN_ID_TAG}` = '{run_id}'"
        )
        if runs:
            self.client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id
        self.continued = False
        created = self.client.create_run(
            experiment_id, run_name=config.run_name or run_id, tags={self.RUN_ID_TAG: run_id}
        )
        return created.info.run_id

    def log_metrics(self, scalars: dict[str, float], step: int, step_metric: str | None) -> None:
        now = int(time.time() * 1000)
        metrics = [
            self._metric(self._name(name), value, now, step)
            for name, value in scalars.items()
            if math.isfinite(value)
        ]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.mlflow_run_id, metrics=metrics[start : start + 1000])

    @staticmethod
    def _name(key: str) -> str:
        """MLflow allows letters, digits and ``_-. :/`` in a metric or param name:
        ``pass@4`` -> ``pass_4``."""
        return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Once per MLflow run: its params cannot change, and a resumed run may change some."""
        if self.continued:
            return
        flat = [
            self._param(self._name(k), str(v)[:6000])
            for k, v in flatten_dict(params, expand_lists=False).items()
        ]
        for start in range(0, len(flat), 100):  # MLflow's batch limit
            self.client.log_batch(self.mlflow_run_id, params=flat[start : start + 100])

    def close(self) -> None:
        self.client.set_terminated(self.mlflow_run_id)


class WandbBackend:
    """A W&B run in offline mode (nothing leaves the machine); its id is the run id, so a
    resumed run continues it when synced."""

    def __init__(self, config: WandbConfig, run_dir: Path, run_id: str) -> None:
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=config.project,
            entity=config.entity,
            name=config.name or run_id,
            id=run_id,
            resume="allow",
            dir=str(_made(run_dir / "wandb")),  # NeMo RL's: W&B's own wandb/ goes inside
            mode="offline",
            # No system-metrics sampler beside the training on a few cores.
            settings=wandb.Settings(
                silent=True, disable_git=True, save_code=False, x_disable_stats=True
            ),
        )

    def log_metrics(self, scalars: dict[str, float], step: int, step_metric: str | None) -> None:
        if step_metric is not None:  # own x-axis (GPU samples over seconds): not the step
            self.run.log(scalars, commit=False)
        else:
            self.run.log(scalars, step=step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()
        # finish() may return before W&B's service has written the run file (seen on
        # wandb 0.31 offline); shutting the service down waits for it.
        self._wandb.teardown()


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def flatten_dict(d: Mapping[str, Any], sep: str = ".", expand_lists: bool = True) -> dict[str, Any]:
    """NeMo RL's flattening of a nested config: keys joined with ``sep``, a list's items
    keyed by their index (kept whole when not ``expand_lists``)."""
    flat: dict[str, Any] = {}

    def visit(value: Any, name: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, f"{name}{sep}{key}" if name else str(key))
        elif isinstance(value, list) and expand_lists and name:
            for index, item in enumerate(value):
                visit(item, f"{name}{sep}{index}")
        else:
            flat[name] = value

    visit(d, "")
    return flat


Backend = JsonlBackend | TensorBoardBackend | MLflowBackend | WandbBackend


class Logger:
    """NeMo RL's ``Logger`` for one run: every metric to ``metrics.jsonl`` and to each
    backend the config enables, all in the run's log folder. Safe to call from several
    threads (the GPU monitor logs from its own)."""

    def __init__(self, config: LoggerConfig | Mapping[str, Any], run_id: str | None = None) -> None:
        """``Logger(cfg)``, as a NeMo RL script calls it (``cfg`` its ``logger:`` section as
        a mapping, checked key by key), logs into ``log_dir`` itself, named by its folder;
        the flows give each run its ``run_id`` and its own folder below ``log_dir``."""
        if not isinstance(config, LoggerConfig):
            config = LoggerConfig.model_validate(dict(config))
        self.config = config
        self.run_dir = run_log_dir(config, run_id) if run_id else Path(config.log_dir)
        self.run_id = run_id or self.run_dir.resolve().name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.backends: list[Backend] = [JsonlBackend(self.run_dir / "metrics.jsonl", self.run_id)]
        if config.tensorboard_enabled:
            self.backends.append(TensorBoardBackend(self.run_dir / "tensorboard"))
        if config.mlflow_enabled:
            self.backends.append(MLflowBackend(config.mlflow, self.run_dir, self.run_id))
        if config.wandb_enabled:
            self.backends.append(WandbBackend(config.wandb, self.run_dir, self.run_id))
        self.gpu_monitor: GpuMonitor | None = None
        if config.monitor_gpus and Machine.current().cuda_devices > 0:
            monitoring = config.gpu_monitoring
            self.gpu_monitor = GpuMonitor(
                monitoring.collection_interval, monitoring.flush_interval, self.log_metrics
            )
            self.gpu_monitor.start()

    def log_metrics(
        self,
        metrics: Mapping[str, Any],
        step: int,
        prefix: str = "",
        step_metric: str | None = None,
    ) -> None:
        """Log ``metrics`` at ``step`` as ``prefix/name``; ``step_metric`` names a metric
        that is its own x-axis (W&B then keeps it off the step counter)."""
        scalars = flatten_metrics(metrics, prefix)
        with self._lock:
            for backend in self.backends:
                backend.log_metrics(scalars, step, step_metric)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        with self._lock:
            for backend in self.backends:
                backend.log_hyperparams(params)

    def log_batched_dict_as_jsonl(self, to_log: Mapping[str, Any], filename: str) -> Path:
        """NeMo RL's per-sample dump (a loop's ``train_data_step3.jsonl``): one line per
        sample of a batch (``BatchedDataDict`` or a dict of equal-length columns), tensors
        as lists, ``idx`` its position. ``filename`` is inside the log folder; the file is
        replaced whole."""
        columns = {key: _as_list(key, value) for key, value in to_log.items()}
        sizes = {key: len(column) for key, column in columns.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"log_batched_dict_as_jsonl({filename!r}): column sizes {sizes}")
        count = next(iter(sizes.values()), 0)
        lines = [
            json.dumps({**{k: c[i] for k, c in columns.items()}, "idx": i}, default=str) + "\n"
            for i in range(count)
        ]
        path = self._log_file(filename)
        path.write_text("".join(lines))
        return path

    def log_string_list_as_jsonl(self, to_log: list[str], filename: str) -> Path:
        """NeMo RL's: each string as one line appended to ``filename`` in the log folder."""
        path = self._log_file(filename)
        with path.open("a") as handle:
            handle.writelines(line + "\n" for line in to_log)
        return path

    def _log_file(self, filename: str) -> Path:
        """``filename`` inside the log folder (sub-folders made); refused if it leaves it."""
        path = (self.run_dir / filename).resolve()
        if not path.is_relative_to(self.run_dir.resolve()) or path == self.run_dir.resolve():
            raise ValueError(f"{filename!r}: not a file inside the log folder {self.run_dir}")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def close(self) -> None:
        if self.gpu_monitor is not None:
            self.gpu_monitor.stop()
        with self._lock:
            for backend in self.backends:
                backend.close()


def _as_list(key: str, value: Any) -> list[Any]:
    """A batch column as one item per sample (tensors and arrays by their first dimension)."""
    if hasattr(value, "tolist") and hasattr(value, "shape"):
        if not value.shape:
            raise ValueError(f"column {key!r} is one number, not one value per sample")
        return list(value.tolist())
    if isinstance(value, list | tuple):
        return list(value)
    raise ValueError(f"column {key!r} is a {type(value).__name__}, not one value per sample")

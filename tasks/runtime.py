"""Warm objects of one run inside one worker process: config, tokenizer, policy, value
model (PPO), generation engine and environments.

Loading a model per stage would dominate an iteration's time, so each process keeps
one of each and tracks which weights version it holds. A generation engine is refit in
place from the newest weights (from the warm policy's memory when it holds them, else
from the checkpoint on storage) instead of being restarted.
"""

import hashlib
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nemo_rl_core.algorithms.grpo import (
    MasterConfig,
    RLMasterConfig,
    build_loss_fn,
    digest_json,
    make_dataloader,
    make_task_to_env,
)
from nemo_rl_core.algorithms.ppo import PPOMasterConfig
from nemo_rl_core.models.generation import configure_generation_config, make_generation
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.value import make_value_model
from tasks.stage import RunRef, open_storage

INITIAL_VERSION = 0
VALUE_DIR = "value"  # the value model's weights and optimizer inside a checkpoint


@dataclass
class WeightsVersion:
    """Which weights: ``step`` 0 is the initial model, step n the checkpoint after n updates."""

    step: int
    digest: str


@dataclass
class RunRuntime:
    run: RunRef
    config: RLMasterConfig
    model_dir: Path
    _tokenizer: Any = None
    _policy: Any = None
    _policy_step: int | None = None
    _value: Any = None
    _value_step: int | None = None
    _generation: Any = None
    _generation_step: int | None = None
    _envs: dict[str, Any] | None = None
    _dataloader: Any = None
    _initial_dataloader_state: dict | None = None
    _scratch: tempfile.TemporaryDirectory = field(default_factory=tempfile.TemporaryDirectory)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            name = self.config.policy.tokenizer.name or str(self.model_dir)
            self._tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
            if self.config.policy.tokenizer.chat_template:
                self._tokenizer.chat_template = self.config.policy.tokenizer.chat_template
        return self._tokenizer

    def weights(self, step: int) -> WeightsVersion:
        """The weights version at the start of iteration ``step``."""
        if step == INITIAL_VERSION:
            return WeightsVersion(0, _dir_digest(self.model_dir))
        info = open_storage(self.run).read_checkpoint_info(step)
        return WeightsVersion(step, info["weights_sha256"])

    def weights_dir(self, step: int) -> Path:
        if step == INITIAL_VERSION:
            return self.model_dir
        return open_storage(self.run).fetch_checkpoint(
            step, Path(self._scratch.name) / f"step_{step}"
        )

    def policy(self, step: int) -> Any:
        """The policy holding the weights (and optimizer state) of ``step``."""
        if self._policy is not None and self._policy_step == step:
            return self._policy
        if self._policy is not None:
            self._policy.shutdown()
        source = self.weights_dir(step)
        optimizer_dir = source / "optimizer" if (source / "optimizer").is_dir() else None
        # model_name -> the resolved local directory: the reference model is its weights.
        policy_config = self.config.policy.model_copy(update={"model_name": str(self.model_dir)})
        self._policy = make_policy(
            policy_config,
            tokenizer=self.tokenizer,
            weights_path=str(source) if step != INITIAL_VERSION else None,
            optimizer_path=str(optimizer_dir) if optimizer_dir else None,
            init_reference_model=True,
        )
        self._policy_step = step
        return self._policy

    @property
    def value_model_dir(self) -> Path:
        return resolve_model(self.config.value.model_name)

    def value_weights(self, step: int) -> WeightsVersion:
        """The value model's weights version at the start of iteration ``step`` (PPO)."""
        if step == INITIAL_VERSION:
            return WeightsVersion(0, _dir_digest(self.value_model_dir))
        info = open_storage(self.run).read_checkpoint_info(step)
        return WeightsVersion(step, info["value_weights_sha256"])

    def value(self, step: int) -> Any:
        """The value model holding the weights (and optimizer state) of ``step`` (PPO)."""
        if self._value is not None and self._value_step == step:
            return self._value
        if self._value is not None:
            self._value.shutdown()
        source = self.weights_dir(step) / VALUE_DIR if step != INITIAL_VERSION else None
        value_config = self.config.value.model_copy(
            update={"model_name": str(self.value_model_dir)}
        )
        self._value = make_value_model(
            value_config,
            tokenizer=self.tokenizer,
            weights_path=str(source) if source else None,
            optimizer_path=str(source / "optimizer") if source else None,
        )
        self._value_step = step
        return self._value

    def value_for_update(self, step: int) -> Any:
        """The value model at ``step``, marked as changing (as ``policy_for_update``)."""
        value = self.value(step)
        self._value_step = None
        return value

    def policy_for_update(self, step: int) -> Any:
        """The policy at ``step``, marked as changing: if the update fails half-way, the next
        call reloads from storage instead of trusting weights of unknown version."""
        policy = self.policy(step)
        self._policy_step = None
        return policy

    def save_checkpoint(self, step: int, dataloader_state: dict, metrics: dict) -> str:
        """Commit the warm policy as checkpoint ``step`` (weights, optimizer, dataloader, RNG),
        with the warm value model under ``value/`` for PPO."""
        storage = open_storage(self.run)
        with storage.staged_checkpoint(step) as local:
            # The weights directory gets the tokenizer too: HF and vLLM load it from there.
            self._policy.save_checkpoint(
                weights_path=str(local), optimizer_path=str(local / "optimizer")
            )
            torch.save(rng_states(), local / "rng_states.pt")
            value_info = {}
            if isinstance(self.config, PPOMasterConfig):
                self._value.save_checkpoint(
                    weights_path=str(local / VALUE_DIR),
                    optimizer_path=str(local / VALUE_DIR / "optimizer"),
                )
                value_info["value_weights_sha256"] = _file_digest(
                    local / VALUE_DIR / "model.safetensors"
                )
            info = {
                "step": step,
                "weights_sha256": _file_digest(local / "model.safetensors"),
                **value_info,
                "dataloader_state": dataloader_state,
                # Flat, as NeMo RL's training_info: checkpointing.metric_name ranks by these.
                **{k: v for k, v in metrics.items() if isinstance(v, int | float)},
            }
            url = storage.write_checkpoint(step, local, info)
        self._policy_step = step
        if value_info:
            self._value_step = step
        return url

    @property
    def dataloader(self) -> Any:
        if self._dataloader is None:
            self._dataloader = make_dataloader(self.config, self.tokenizer)
            self._initial_dataloader_state = self._dataloader.state_dict()
        return self._dataloader

    def dataloader_state(self, step: int) -> dict:
        """Where the dataloader stands at the start of iteration ``step``."""
        if step == INITIAL_VERSION:
            self.dataloader  # noqa: B018 - builds it and records its initial state
            return dict(self._initial_dataloader_state)
        return open_storage(self.run).read_checkpoint_info(step)["dataloader_state"]

    @property
    def config_digest(self) -> str:
        return digest_json(self.config.model_dump(mode="json"))

    def generation(self, step: int) -> Any:
        """A warm generation engine holding the weights of ``step`` (refit if older)."""
        if self._generation is None:
            settings = configure_generation_config(self.config.policy.generation, self.tokenizer)
            self._generation = make_generation(
                settings, str(self.weights_dir(step)), seed=self.config.algorithm.seed
            )
        elif self._generation_step != step:
            if self._policy is not None and self._policy_step == step:
                self._generation.update_weights_from_state_dict(self._policy.state_dict_for_refit())
            else:
                self._generation.update_weights_from_checkpoint(str(self.weights_dir(step)))
        self._generation_step = step
        return self._generation

    @property
    def task_to_env(self) -> dict[str, Any]:
        if self._envs is None:
            self._envs = make_task_to_env(self.config)
        return self._envs

    def loss_fn(self) -> Any:
        return build_loss_fn(self.config)

    def close(self) -> None:
        for env in (self._envs or {}).values():
            env.shutdown()
        for engine in (self._generation, self._policy, self._value):
            if engine is not None:
                engine.shutdown()
        self._scratch.cleanup()


_runtimes: dict[RunRef, RunRuntime] = {}


def runtime_for(run: RunRef) -> RunRuntime:
    """This process's runtime for ``run``, built from the config stored with the run."""
    if run not in _runtimes:
        stored = open_storage(run).read_run_config()
        if stored is None:
            raise FileNotFoundError(
                f"run {run.run_id!r} under {run.storage_root} has no stored config.yaml"
            )
        config_class = PPOMasterConfig if "ppo" in stored else MasterConfig
        config = config_class.model_validate(stored)
        _runtimes[run] = RunRuntime(run, config, resolve_model(config.policy.model_name))
    return _runtimes[run]


def close_runtime(run: RunRef) -> None:
    runtime = _runtimes.pop(run, None)
    if runtime is not None:
        runtime.close()


def _dir_digest(model_dir: Path) -> str:
    """Digest of a model directory's weight files (names, sizes, mtimes: cheap, stable)."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def rng_states() -> dict[str, Any]:
    """Python, NumPy and torch RNG states, stored with each checkpoint."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }

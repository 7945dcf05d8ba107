"""Warm objects of one run inside one worker process: config, tokenizer, policy, value
model, generation engine, environments and dataloader.

Loading a model per stage would dominate an iteration's time, so each process keeps
one of each and tracks which weights version it holds. A generation engine is refit in
place from the newest weights (from the warm policy's memory when it holds them, else
from the checkpoint on storage) instead of being restarted.
"""

import hashlib
import json
import logging
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import torch

from nemo_rl_core.algorithms.schedule import planned_steps
from nemo_rl_core.algorithms.scoring import make_task_to_env
from nemo_rl_core.config.cluster import PLACEMENT_KEYS
from nemo_rl_core.config.orchestration import SECTION
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import DataSetup, build_dataset
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.interfaces import EnvironmentInterface
from nemo_rl_core.models.generation import configure_generation_config, make_generation
from nemo_rl_core.models.generation.interfaces import GenerationInterface
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.policy.config import TrainedModelConfig
from nemo_rl_core.models.policy.hf_loading import load_tokenizer
from nemo_rl_core.models.policy.interfaces import ColocatablePolicyInterface, PolicyInterface
from nemo_rl_core.models.policy.offload import Offloadable
from nemo_rl_core.models.value import make_value_model
from nemo_rl_core.models.value.interfaces import ValueInterface
from nemo_rl_core.pipeline.registry import pipeline_for_config
from nemo_rl_core.pipeline.spec import Pipeline, Version, declared
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import Retention, RunStorage
from nemo_rl_core.utils.checkpoint import (
    INITIAL_STEP,
    MODEL_DIRS,
    OPTIMIZER_DIR,
    Checkpointable,
    TrainingInfo,
    WeightsVersion,
    commit_trained_checkpoint,
    read_training_info,
    weights_version,
)
from nemo_rl_core.utils.checkpoint_copy import checkpoint_copy, copy_name
from nemo_rl_core.utils.worker_env import WorkerEnvironment


def digest_json(value: Any) -> str:
    """A stable digest of JSON-able data (configs, dataloader states)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def training_env_vars(model: TrainedModelConfig, section: str) -> tuple[dict | None, str]:
    """The ``env_vars`` of the backend that trains ``model`` (NeMo RL's worker reads those of
    the section in use), and their key."""
    if model.training_backend == "megatron":
        megatron = model.megatron_cfg
        return (megatron.env_vars if megatron else None), f"{section}.megatron_cfg.env_vars"
    return model.dtensor_cfg.env_vars, f"{section}.dtensor_cfg.env_vars"


log = logging.getLogger(__name__)


class RefitSource(Protocol):
    """A policy that can hand its weights to a generation engine in memory (HF names, in
    the precision the engine runs), which spares a round trip through storage."""

    def state_dict_for_refit(self) -> dict[str, torch.Tensor]: ...


@dataclass
class RunRuntime:
    """The run's warm objects in this process, each tagged with the step it holds."""

    run: RunRef
    pipeline: Pipeline
    config: Any
    model_dir: Path
    _tokenizer: Any = None
    _policy: PolicyInterface | None = None
    _policy_step: int | None = None
    _value: ValueInterface | None = None
    _value_step: int | None = None
    _teacher: PolicyInterface | None = None
    _generation: GenerationInterface | None = None
    _generation_step: int | None = None
    _envs: dict[str, EnvironmentInterface] | None = None
    _dataloader: StatefulDataLoader | None = None
    _initial_dataloader_state: dict | None = None
    _committed_infos: dict[int, TrainingInfo] = field(default_factory=dict)
    _scratch: tempfile.TemporaryDirectory = field(default_factory=tempfile.TemporaryDirectory)
    # The models' env_vars, set in this process while the run's warm objects live.
    _environment: WorkerEnvironment = field(default_factory=WorkerEnvironment)
    # Under async GRPO the rollouts of later iterations run in a thread beside training:
    # one stage at a time drives the engine, and one fetch at a time fills the scratch dir
    # (retention waits for it).
    _generation_lock: threading.Lock = field(default_factory=threading.Lock)
    _fetch_lock: threading.Lock = field(default_factory=threading.Lock)
    # Shards of a split stage run side by side in one process: one of them loads a model.
    _models_lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def storage(self) -> RunStorage:
        return open_storage(self.run)

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer; the value model reads the same tokens (as in NeMo RL)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.config.policy)
        return self._tokenizer

    @cached_property
    def config_digest(self) -> str:
        """What of the config decides stage outputs: all of it but ``orchestration`` and
        where stages run (``cluster.placement``). Every stage names it in its inputs; the
        runtime's config never changes, so it is computed once (dumping the config is
        ~0.5 ms a stage)."""
        exclude: dict[str, Any] = {SECTION: True, "cluster": set(PLACEMENT_KEYS)}
        return digest_json(self.config.model_dump(mode="json", exclude=exclude))

    # ---- versions: what a stage's output depends on besides its inputs ---------------

    def version(self, kind: Version, step: int) -> str:
        """The digest of ``kind`` at the start of iteration ``step``."""
        if kind == "policy":
            return self.weights(step).digest
        if kind == "value":
            return self.value_weights(step).digest
        return digest_json(self.dataloader_state(step))

    def weights(self, step: int) -> WeightsVersion:
        """The policy's weights version at the start of iteration ``step``."""
        return weights_version(self.model_dir, step, "policy", self._committed_info)

    def value_weights(self, step: int) -> WeightsVersion:
        return weights_version(self.value_model_dir, step, "value", self._committed_info)

    def dataloader_state(self, step: int) -> dict:
        """Where the dataloader stands at the start of iteration ``step``: as its checkpoint
        recorded it, or, before that is committed (async GRPO's prompts run ahead of
        training), as the previous iteration's prompts stage left it, which the checkpoint
        copies."""
        if step == INITIAL_STEP:
            self.dataloader  # noqa: B018 - builds it and records its initial state
            return dict(self._initial_dataloader_state or {})
        if step in self._committed_infos or self.storage.is_committed(step):
            return self._committed_info(step).dataloader_state
        entry = self.storage.read_manifest(step - 1).complete("prompts")
        if entry is None:
            raise FileNotFoundError(
                f"run {self.run.run_id}: iteration {step} has no committed checkpoint and "
                f"iteration {step - 1} no complete prompts stage to take its dataloader from"
            )
        return self.storage.read_json(entry.outputs["dataloader_state"])

    def _committed_info(self, step: int) -> TrainingInfo:
        """Checkpoint ``step``'s training info, read once: every stage's inputs name the
        weights and dataloader position it starts from, and those never change once
        committed. The runtime lasts one flow run, which holds the run's lease; the
        validation metrics recorded into the info later are not read through here."""
        if step not in self._committed_infos:
            self._committed_infos[step] = read_training_info(self.storage, step)
        return self._committed_infos[step]

    # ---- warm models -----------------------------------------------------------------

    def weights_dir(self, step: int) -> Path:
        """A local folder with the weights (and optimizer state) of ``step`` that does not
        change while this runtime lasts: the initial model, or this process's verified copy
        of checkpoint ``step`` (``checkpoint_copy``), made once. The rollout thread's refit
        and the flow thread's policy ask for the same step: a second fetch into the folder
        the first caller was reading tore its files (issue 34)."""
        if step == INITIAL_STEP:
            return self.model_dir
        info = self._committed_info(step)
        folder = Path(self._scratch.name) / copy_name(step, info)
        with self._fetch_lock:
            if not folder.is_dir():  # only a verified copy is ever renamed to that name
                checkpoint_copy(self.storage, step, info, folder)
        return folder

    def prune_checkpoints(self) -> Retention:
        """Retention of the run's checkpoints (``checkpointing:``; ``RunStorage.
        prune_checkpoints``), never while this process copies one: the rollout thread's
        fetch never has its source deleted under it. The newest ``ahead_depth + 1`` stay:
        the rollouts still ahead generate from them; with ``checkpointing.enabled: false``
        only they do (NeMo RL keeps no checkpoint; a continued run starts from the newest)."""
        settings = self.config.checkpointing
        with self._fetch_lock:
            return self.storage.prune_checkpoints(
                settings.keep_top_k if settings.enabled else 0,
                metric_name=settings.metric_name,
                higher_is_better=settings.higher_is_better,
                save_period=settings.save_period,
                keep_newest=self.pipeline.ahead_depth(self.config) + 1,
            )

    def policy(self, step: int) -> PolicyInterface:
        """The policy holding the weights (and optimizer state) of ``step``."""
        with self._models_lock:
            if self._policy is not None and self._policy_step == step:
                return self._policy
            if self._policy is not None:
                self._policy.shutdown()
            started = time.perf_counter()
            source = self.weights_dir(step)
            optimizer_dir = source / OPTIMIZER_DIR
            # model_name -> the resolved local directory: the reference model is its weights.
            policy_config = self.config.policy.model_copy(
                update={"model_name": str(self.model_dir)}
            )
            self._environment.apply(*training_env_vars(policy_config, "policy"))
            self._policy = make_policy(
                policy_config,
                tokenizer=self.tokenizer,
                weights_path=str(source) if step != INITIAL_STEP else None,
                optimizer_path=str(optimizer_dir) if optimizer_dir.is_dir() else None,
                init_reference_model=self.pipeline.reference_policy,
            )
            self._policy_step = step
            log.info(
                "run %s: policy loaded at the weights of step %d (%.1f s)",
                self.run.run_id,
                step,
                time.perf_counter() - started,
            )
            return self._policy

    @contextmanager
    def policy_in_use(self, step: int) -> Iterator[PolicyInterface]:
        """The policy at ``step``, held by this caller alone until the block ends: the
        shards of a split stage, side by side in one process, take turns with it."""
        with self._models_lock:
            yield self.policy(step)

    def reference_policy(self) -> PolicyInterface:
        """A policy holding the run's frozen reference model (the starting weights, which
        every policy of the run keeps): the warm one at whatever step it is, else the
        starting policy, so reference logprobs need no checkpoint of any step."""
        if self._policy is not None and self._policy_step is not None:
            return self._policy
        return self.policy(INITIAL_STEP)

    def policy_for_update(self, step: int) -> PolicyInterface:
        """The policy at ``step``, marked as changing: if the update fails half-way, the next
        call reloads from storage instead of trusting weights of unknown version."""
        policy = self.policy(step)
        self._policy_step = None
        return policy

    @property
    def value_model_dir(self) -> Path:
        return resolve_model(self.config.value.model_name)

    def value(self, step: int) -> ValueInterface:
        """The value model holding the weights (and optimizer state) of ``step``."""
        with self._models_lock:
            if self._value is not None and self._value_step == step:
                return self._value
            if self._value is not None:
                self._value.shutdown()
            source = self.weights_dir(step) / MODEL_DIRS["value"] if step != INITIAL_STEP else None
            value_config = self.config.value.model_copy(
                update={"model_name": str(self.value_model_dir)}
            )
            self._environment.apply(*training_env_vars(value_config, "value"))
            self._value = make_value_model(
                value_config,
                tokenizer=self.tokenizer,
                weights_path=str(source) if source else None,
                optimizer_path=str(source / OPTIMIZER_DIR) if source else None,
            )
            self._value_step = step
            return self._value

    def value_for_update(self, step: int) -> ValueInterface:
        """The value model at ``step``, marked as changing (as ``policy_for_update``)."""
        value = self.value(step)
        self._value_step = None
        return value

    def teacher(self) -> PolicyInterface:
        """On-policy distillation's ``teacher:``: frozen weights, inference only (no optimizer,
        no reference copy), reading the student's tokens."""
        with self._models_lock:
            if self._teacher is None:
                teacher = self.config.teacher
                resolved = str(resolve_model(teacher.model_name))
                self._environment.apply(*training_env_vars(teacher, "teacher"))
                self._teacher = make_policy(
                    teacher.model_copy(update={"model_name": resolved}),
                    tokenizer=self.tokenizer,
                    init_optimizer=False,
                    init_reference_model=False,
                )
            return self._teacher

    def commit_checkpoint(
        self,
        step: int,
        models: dict[str, Checkpointable],
        dataloader_state: dict,
        metrics: dict[str, Any],
    ) -> str:
        """Commit the updated ``models`` as checkpoint ``step``; they now hold that step."""
        url, info = commit_trained_checkpoint(self.storage, step, models, dataloader_state, metrics)
        self._committed_infos[step] = info  # the next iteration's stages name it
        if "policy" in models:
            self._policy_step = step
        if "value" in models:
            self._value_step = step
        return url

    @contextmanager
    def generation(self, step: int) -> Iterator[GenerationInterface]:
        """The warm generation engine holding the weights of ``step`` (refit if older), held
        by this caller alone until the block ends. The refit takes the warm policy's memory
        when it holds that step, unless rollouts run beside training (async GRPO), where the
        policy may be changing under the refit: then the committed checkpoint."""
        with self._generation_lock:
            colocated = self._colocated_policy()
            if colocated is not None:
                colocated.offload_before_refit()
            started = time.perf_counter()
            if self._generation is None:
                settings = configure_generation_config(
                    self.config.policy.generation, self.tokenizer
                )
                if settings.backend == "vllm":
                    self._environment.apply(settings.vllm_cfg.env_vars, "vllm_cfg.env_vars")
                self._generation = make_generation(
                    settings,
                    str(self.weights_dir(step)),
                    seed=self.config.algorithm.seed,
                    batch_size=getattr(self.config.policy, "generation_batch_size", None),
                )
                log.info(
                    "run %s: generation engine started at the weights of step %d (%.1f s)",
                    self.run.run_id,
                    step,
                    time.perf_counter() - started,
                )
            elif self._generation_step != step:
                overlapping = self.pipeline.ahead_depth(self.config) > 0
                if not overlapping and self._policy is not None and self._policy_step == step:
                    source: RefitSource = self._policy  # type: ignore[assignment]
                    self._generation.update_weights_from_state_dict(source.state_dict_for_refit())
                    origin = "the policy in memory"
                else:
                    self._generation.update_weights_from_checkpoint(str(self.weights_dir(step)))
                    origin = "the committed checkpoint"
                log.info(
                    "run %s: generation engine refit in place to step %d from %s (%.3f s)",
                    self.run.run_id,
                    step,
                    origin,
                    time.perf_counter() - started,
                )
            if colocated is not None:
                colocated.offload_after_refit()
            self._generation_step = step
            yield self._generation

    def release_devices(self) -> None:
        """The warm sharded models' weights (and the trained ones' optimizer state) into host
        memory, their GPUs free for other processes until the next pass brings them back (a
        rank on the flow's own machine, between orders: ``flows.rank_group``)."""
        for model in (self._policy, self._value, self._teacher):
            if isinstance(model, Offloadable):
                model.offload(weights=True)

    def _colocated_policy(self) -> ColocatablePolicyInterface | None:
        """The warm policy when it gives the GPU to the generation engine between steps
        (``policy.generation.colocated.enabled``), as NeMo RL's colocated refit does: its
        optimizer state leaves before the refit, its weights after it, and the next logprob
        or training pass brings them back. Never while rollouts run beside training (async
        GRPO), which NeMo RL does not colocate either."""
        policy, generation = self._policy, self.config.policy.generation
        if (
            isinstance(policy, ColocatablePolicyInterface)
            and generation is not None
            and generation.colocated.enabled
            and self.pipeline.ahead_depth(self.config) == 0
        ):
            return policy
        return None

    # ---- data and environments -------------------------------------------------------

    def final_step(self) -> int:
        """The run's last training step: ``max_num_steps``, or the end of ``max_num_epochs``."""
        return planned_steps(self.config.algorithm, len(self.dataloader))

    def validation_batches(self) -> Iterator[BatchedDataDict]:
        """The validation prompts in order, ``val_batch_size`` per batch (all in one batch when
        it is None), as NeMo RL's unshuffled validation dataloader serves them."""
        dataset = build_dataset(
            self.config.data, self.tokenizer, split="validation", setup=self.data_setup()
        )
        if len(dataset) == 0:
            return iter(())
        size = self.config.algorithm.val_batch_size or len(dataset)
        loader = StatefulDataLoader(dataset, batch_size=size, shuffle=False, drop_last=False)
        return iter([loader.next_batch() for _ in range(len(loader))])

    def data_setup(self) -> DataSetup:
        return declared(self.pipeline, "data_setup")(self.config)

    @property
    def dataloader(self) -> StatefulDataLoader:
        if self._dataloader is None:
            tokenizer = self.tokenizer if self.pipeline.tokenized else None
            self._dataloader = declared(self.pipeline, "dataloader")(self.config, tokenizer)
            self._initial_dataloader_state = self._dataloader.state_dict()
        return self._dataloader

    @property
    def task_to_env(self) -> dict[str, EnvironmentInterface]:
        if self._envs is None:
            self._envs = make_task_to_env(self.config)
        return self._envs

    def close(self) -> None:
        for env in (self._envs or {}).values():
            env.shutdown()
        for engine in (self._generation, self._policy, self._value, self._teacher):
            if engine is not None:
                engine.shutdown()
        self._environment.restore()
        self._scratch.cleanup()
        self.storage.forget_writes()


_runtimes: dict[RunRef, RunRuntime] = {}


def runtime_for(run: RunRef) -> RunRuntime:
    """This process's runtime for ``run``, built from the config stored with the run."""
    if run not in _runtimes:
        stored = open_storage(run).read_run_config()
        if stored is None:
            raise FileNotFoundError(
                f"run {run.run_id!r} under {run.storage_root} has no stored config.yaml"
            )
        pipeline = pipeline_for_config(stored)
        config: Any = pipeline.config_class.model_validate(stored)
        model_dir = resolve_model(config.policy.model_name)
        open_storage(run).forget_writes()  # a new flow run reads what is stored
        _runtimes[run] = RunRuntime(run, pipeline, config, model_dir)
    return _runtimes[run]


def close_runtime(run: RunRef) -> None:
    runtime = _runtimes.pop(run, None)
    if runtime is not None:
        runtime.close()

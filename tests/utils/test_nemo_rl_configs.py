"""NeMo RL v0.7.0's own example configs load here with no key removed, and the four the
project promises run on this CPU with overrides of the model, the data and sizes only.

The configs are read at test time from a git mirror of NVIDIA-NeMo/RL (``nemo_rl_configs``,
``tests/nemo_rl_examples.py``); nothing of NeMo RL is stored in the project. Without a
mirror the tests skip, saying so.
"""

import json
import os
from pathlib import Path

import pytest
from nemo_rl_examples import SMALL, SMALL_GRPO, validated

from flows.config_check import check_run_config
from nemo_rl_core.algorithms.grpo_config import MasterConfig, data_setup
from nemo_rl_core.data.datasets.builder import load_rows
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.pipeline.registry import pipeline_for_config
from nemo_rl_core.pipeline.runtime import RunRuntime
from nemo_rl_core.storage.handles import RunRef
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import Machine, UnsupportedConfigError, check_support

# The GRPO, PPO, SFT, DPO, RM, eval and distillation configs of NeMo RL whose models are
# text-only LLMs.
LOADING = [
    "grpo_math_1B",
    "sft",
    "sft_openmathinstruct2",
    "dpo",
    "rm",
    "grpo_math_8B",
    "grpo_sliding_puzzle",
    "ppo_math_1B",
    "grpo_math_1B_megatron",
    "grpo_math_8B_megatron",
    "ppo_math_1B_megatron",
    "grpo_math_70B_megatron",
    "grpo_math_8B_megatron_fp8",
    "grpo_math_1B_sglang",
    "grpo_smoke",
    "grpo_multiple_datasets",
    "prorlv2.v2",
    "evals/eval",
    "evals/local_eval",
    "evals/math_eval",
    "distillation_math",
    # Mixture-of-experts, quantization and performance recipes: every key declared, the
    # features not built here refused by check_support (test below), not by the schema.
    "grpo_math_qwen30ba3b_megatron",
    "recipes/llm/grpo-moonlight-16b-automodel-1n8g-ep8",
    "recipes/llm/sft-nanov3-30BA3B-2n8g-fsdp2",
    "recipes/llm/sft-gpt-oss-20b-1n8g-fsdp8ep8-automodel",
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron",
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron-cp2-r3",
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n8g-megatron",
    "recipes/llm/grpo-moonlight-16ba3b-4n8g-megatron-fp8-e2e",
    "recipes/llm/grpo-qwen3-30ba3b-4n8g-megatron-qa-nvfp4",
    "recipes/llm/dpo-qwen2.5-math7b-1n8g-megatron_chunked_linear_ce_loss",
    "recipes/llm/sft-qwen3-0.6B-1n8g-megatron-yarn-128k",
    "recipes/llm/performance/grpo-qwen3-30ba3b-4n8g",
    "recipes/llm/performance/grpo-deepseek-v3-32n4g",
    "grpo_rm_1B",
    "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron",
    "recipes/llm/performance/dapo-deepseek-v3-64n8g.v2",
]
CPU_OVERRIDES = {
    "grpo_math_1B": [*SMALL, "data.train.dataset_name=arithmetic", *SMALL_GRPO],
    "grpo_math_8B": [
        *SMALL,
        "cluster.gpus_per_node=1",
        "data.train.dataset_name=arithmetic",
        *SMALL_GRPO,
    ],
    "grpo_sliding_puzzle": [
        *SMALL,
        "policy.max_total_sequence_length=512",
        *SMALL_GRPO,
        "grpo.max_rollout_turns=2",
        "env.sliding_puzzle_game.cfg.game_config.size=2",
    ],
    "evals/eval": ["generation.model_name=tiny-llama", "data.dataset_name=addition"],
    "ppo_math_1B": [
        *SMALL,
        "value.model_name=tiny-llama",
        "data.train.dataset_name=arithmetic",
        "data.validation.dataset_name=arithmetic",
        *(key.replace("grpo.", "ppo.") for key in SMALL_GRPO),
    ],
    # Its critic sets reward_model_cfg.enabled: false, which NeMo RL's Megatron critic
    # never reads (its head is always a scalar regression).
    "ppo_math_1B_megatron": [
        *SMALL,
        "value.model_name=tiny-llama",
        "data.train.dataset_name=arithmetic",
        "data.validation.dataset_name=arithmetic",
        *(key.replace("grpo.", "ppo.") for key in SMALL_GRPO),
        "policy.sequence_packing.enabled=false",
        "policy.megatron_cfg.optimizer.bf16=false",
        "value.sequence_packing.enabled=false",
        "value.megatron_cfg.optimizer.bf16=false",
        "value.precision=float32",
    ],
}


@pytest.mark.parametrize("name", LOADING)
def test_nemo_rl_config_loads_with_every_key(nemo_rl_configs: Path, name: str) -> None:
    validated(nemo_rl_configs / f"{name}.yaml", [])


@pytest.mark.parametrize("name", sorted(CPU_OVERRIDES))
def test_promised_configs_run_here_with_model_data_and_size_overrides(
    nemo_rl_configs: Path, name: str
) -> None:
    config = validated(nemo_rl_configs / f"{name}.yaml", CPU_OVERRIDES[name])
    check_support(config, Machine(cuda_devices=0), source=name)


GRPO_1B = [*SMALL, "data.train.dataset_name=arithmetic", *SMALL_GRPO]
# Packing is not built on Megatron here; SMALL's float32 turns its bf16 flag off.
MEGATRON_ON_CPU = [
    "policy.sequence_packing.enabled=false",
    "policy.megatron_cfg.optimizer.bf16=false",
]
# Values refused where their section is read, in NeMo RL configs where it is not.
UNREAD_SECTIONS = {
    "megatron_cfg while the HF backend trains": (
        "grpo_math_1B",
        [
            "policy.megatron_cfg.pipeline_model_parallel_size=2",
            "policy.megatron_cfg.context_parallel_size=2",
            "policy.megatron_cfg.mtp_num_layers=1",
        ],
    ),
    "dtensor_cfg while Megatron trains": (
        "grpo_math_1B_megatron",
        [
            *MEGATRON_ON_CPU,
            "policy.dtensor_cfg.tensor_parallel_size=2",
            "policy.dtensor_cfg.context_parallel_size=2",
            "policy.dtensor_cfg.lora_cfg.enabled=true",
        ],
    ),
    "vllm_cfg while transformers generates": (
        "grpo_math_1B",
        [
            "policy.generation.backend=hf",
            "policy.generation.vllm_cfg.async_engine=true",
            "policy.generation.vllm_cfg.tensor_parallel_size=2",
            "policy.generation.vllm_cfg.expert_parallel_size=2",
        ],
    ),
    "lora_cfg while LoRA is off": (
        "grpo_math_1B",
        [
            "policy.dtensor_cfg.lora_cfg.dropout=0.1",
            "policy.dtensor_cfg.lora_cfg.dropout_position=post",
        ],
    ),
    "colocated.resources while generation is colocated": (
        "grpo_math_1B",
        ["policy.generation.colocated.resources.gpus_per_node=2"],
    ),
    "async_grpo while it is off": (
        "grpo_math_1B",
        ["grpo.async_grpo.in_flight_weight_updates=true"],
    ),
    "reward_scaling while it is off": ("grpo_math_1B", ["grpo.reward_scaling.source_max=0"]),
    "checkpointing while it is off": (
        "grpo_smoke",
        ["checkpointing.model_save_format=torch_save", "checkpointing.save_optimizer=false"],
    ),
}


@pytest.mark.parametrize("section", sorted(UNREAD_SECTIONS))
def test_a_rule_applies_only_where_nemo_rl_reads_its_section(
    nemo_rl_configs: Path, section: str
) -> None:
    """NeMo RL does not read a section that is off (a backend not in use, a feature not
    switched on): values it would never read run, here as there."""
    name, unread = UNREAD_SECTIONS[section]
    config = validated(nemo_rl_configs / f"{name}.yaml", [*GRPO_1B, *unread])
    check_support(config, Machine(cuda_devices=0), source=name)


def test_the_same_values_are_refused_where_the_section_is_read(nemo_rl_configs: Path) -> None:
    overrides = [
        *GRPO_1B,
        "policy.megatron_cfg.pipeline_model_parallel_size=2",
        "policy.generation.vllm_cfg.expert_parallel_size=2",
        "policy.dtensor_cfg.lora_cfg.enabled=true",
        "policy.dtensor_cfg.lora_cfg.dropout=0.1",
        "policy.dtensor_cfg.lora_cfg.dropout_position=post",
        "checkpointing.model_save_format=torch_save",
    ]
    config = validated(nemo_rl_configs / "grpo_math_1B.yaml", overrides)
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(config, Machine(cuda_devices=0), source="grpo_math_1B")
    refused = {refusal.key for refusal in err.value.refusals}
    assert refused == {
        "policy.generation.vllm_cfg.expert_parallel_size",
        "policy.dtensor_cfg.lora_cfg.dropout_position",
        "checkpointing.model_save_format",
    }
    megatron = validated(
        nemo_rl_configs / "grpo_math_1B_megatron.yaml",
        [*GRPO_1B, *MEGATRON_ON_CPU, "policy.megatron_cfg.pipeline_model_parallel_size=2"],
    )
    with pytest.raises(UnsupportedConfigError, match="pipeline_model_parallel_size=2: pipeline"):
        check_support(megatron, Machine(cuda_devices=0), source="grpo_math_1B_megatron")


def test_a_puzzle_run_reads_its_games_not_the_dataset_it_inherits(nemo_rl_configs: Path) -> None:
    """grpo_sliding_puzzle.yaml keeps grpo_math_1B's data.train (OpenMathInstruct-2, a hub
    dataset) and NeMo RL's puzzle runner never reads it: games come from env.sliding_puzzle_
    game. The config check passes without touching it, and both splits are games."""
    path = nemo_rl_configs / "grpo_sliding_puzzle.yaml"
    config = check_run_config(MasterConfig, str(path), CPU_OVERRIDES["grpo_sliding_puzzle"])
    assert config.data.train[0].dataset_name == "OpenMathInstruct-2"
    setup = data_setup(config)
    for split in ("train", "validation"):
        rows = load_rows(config.data, split, setup)
        assert rows and {row["task_name"] for row in rows} == {"sliding_puzzle_game"}
    # A dataset the puzzle's environment scores is read, and this one cannot load here.
    scored = "data.default.env_name=sliding_puzzle_game"
    named = validated(path, [*CPU_OVERRIDES["grpo_sliding_puzzle"], scored])
    with pytest.raises(UnsupportedConfigError, match="'OpenMathInstruct-2': a Hugging Face hub"):
        check_support(named, Machine(cuda_devices=0), source="grpo_sliding_puzzle")


DPO_SMALL = [
    *(key for key in SMALL if "logprob_batch_size" not in key),  # dpo.yaml has no such key
    "policy.tokenizer.name=tiny-llama",
    "policy.train_global_batch_size=4",
    "policy.train_micro_batch_size=2",
    "data.train.dataset_name=addition_preference",
    "data.validation.dataset_name=addition_preference",
]


def test_dpo_worker_env_vars_are_set_while_the_run_holds_its_policy(
    nemo_rl_configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo RL's dpo.yaml gives its DTensor worker PYTORCH_CUDA_ALLOC_CONF="": here the
    policy lives in the stage's process, which has it while the run's policy is warm, and
    loses it again when the run's warm objects close."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    config = validated(nemo_rl_configs / "dpo.yaml", DPO_SMALL)
    check_support(config, Machine(cuda_devices=0), source="dpo")
    assert config.policy.dtensor_cfg.env_vars == {"PYTORCH_CUDA_ALLOC_CONF": ""}
    pipeline = pipeline_for_config(config.model_dump(mode="json"))
    model_dir = resolve_model(config.policy.model_name)
    runtime = RunRuntime(RunRef(str(tmp_path), "dpo-env"), pipeline, config, model_dir)
    runtime.policy(0)
    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == ""
    runtime.close()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_what_cannot_run_here_is_refused_by_key(nemo_rl_configs: Path) -> None:
    config = validated(nemo_rl_configs / "grpo_math_8B_megatron.yaml", [])
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(config, Machine(cuda_devices=0), source="grpo_math_8B_megatron")
    text = str(err.value)
    assert "policy.megatron_cfg.pipeline_model_parallel_size=2" in text
    assert "data.train.0.dataset_name='OpenMathInstruct-2'" in text


def test_expert_parallel_recipe_is_refused_by_key_before_any_work(nemo_rl_configs: Path) -> None:
    name = "recipes/llm/grpo-moonlight-16b-automodel-1n8g-ep8"
    config = validated(nemo_rl_configs / f"{name}.yaml", [])
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(config, Machine(cuda_devices=8), source=name)
    assert (
        "policy.dtensor_cfg.expert_parallel_size=8: expert parallelism (MoE) is not built here"
        in str(err.value)
    )


def test_batch_multiplier_without_dynamic_sampling_is_refused_as_nemo_rl_does(
    nemo_rl_configs: Path,
) -> None:
    """prorlv2_1_moe.v2 turns dynamic sampling off and keeps prorlv2.v2's batch_multiplier
    1.5, which NeMo RL's GRPO setup asserts against (``batch_multiplier>1 can only be used
    if use_dynamic_sampling=True``): it does not run there either."""
    with pytest.raises(ConfigError, match="batch_multiplier=1.5 needs use_dynamic_sampling"):
        validated(nemo_rl_configs / "prorlv2_1_moe.v2.yaml", [])
    validated(nemo_rl_configs / "prorlv2_1_moe.v2.yaml", ["grpo.batch_multiplier=1"])


def test_reward_model_scorer_from_a_policy_checkpoint_is_refused(nemo_rl_configs: Path) -> None:
    """grpo_rm_1B's env.reward_model is a policy section: the keys scoring never reads load;
    checkpoint_path, which NeMo RL would load the scorer's weights from, is refused."""
    overrides = ["env.reward_model.checkpoint_path=/ckpt/step_10"]
    config = validated(nemo_rl_configs / "grpo_rm_1B.yaml", overrides)
    with pytest.raises(UnsupportedConfigError, match="env.reward_model.checkpoint_path='/ckpt"):
        check_support(config, Machine(cuda_devices=2), source="grpo_rm_1B")


def test_an_environment_section_no_dataset_names_loads_and_is_not_read(
    nemo_rl_configs: Path,
) -> None:
    """NeMo RL builds only the environments its datasets name, so its DAPO recipes keep an
    env.dapo section no dataset reads (and no environment of that name exists): it is not
    refused; a dataset that names it is."""
    name = "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron"
    config = validated(nemo_rl_configs / f"{name}.yaml", [])
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(config, Machine(cuda_devices=8), source=name)
    assert "dapo" not in {refusal.key for refusal in err.value.refusals}
    assert "'dapo'" not in str(err.value)
    with pytest.raises(ConfigError, match="env.dapo: unknown environment 'dapo'"):
        validated(nemo_rl_configs / f"{name}.yaml", ["data.default.env_name=dapo"])


@pytest.mark.parametrize(
    ("name", "refusals"),
    [
        (
            "vlm_grpo_3B",
            [
                "data.train.0.dataset_name='clevr-cogent': a vision or audio dataset",
                "data.train.0.processor='vlm_hf_data_processor': NeMo RL's processor of vision",
                "'clevr-cogent': a vision or audio environment",
            ],
        ),
        ("sft_vlm_3B", ["data.train.0.dataset_name='clevr-cogent': a vision or audio dataset"]),
        ("audio_grpo_3B_megatron", ["data.train.0.dataset_name='avqa': a vision or audio"]),
        ("gdpo_math_1B", ["data.train.0.dataset_name='gsm8k': a Hugging Face hub dataset"]),
        ("evals/mmau", ["'mmau': a vision or audio environment"]),
    ],
)
def test_multimodal_and_multi_reward_recipes_load_and_are_refused_by_key(
    nemo_rl_configs: Path, name: str, refusals: list[str]
) -> None:
    """NeMo RL's vision and audio recipes name datasets, processors and environments of its
    registries that are not built here, its GDPO recipe a hub dataset: they load, and each
    such key is refused with why before any work (GDPO and its multi-reward environment
    run: tests/flows/test_gdpo_flow.py)."""
    config = validated(nemo_rl_configs / f"{name}.yaml", [])
    with pytest.raises(UnsupportedConfigError) as err:
        check_support(config, Machine(cuda_devices=8), source=name)
    for refusal in refusals:
        assert refusal in str(err.value)


@pytest.mark.parametrize(
    "name",
    [
        "xtoken_off_policy_distillation",
        "recipes/llm/distillation-xtoken-off-policy-qwen3-4b-to-llama3.2-1b-1n8g-dtensor-tp4cp2",
    ],
)
def test_cross_tokenizer_distillation_is_refused_in_one_line(
    nemo_rl_configs: Path, name: str
) -> None:
    with pytest.raises(ConfigError, match="teachers: NeMo RL's cross-tokenizer off-policy"):
        validated(nemo_rl_configs / f"{name}.yaml", [])


@pytest.mark.parametrize(
    "name",
    [
        "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron_generation-async-gym",
        "recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack",
    ],
)
def test_nemo_gym_recipes_are_refused_in_one_line(
    nemo_rl_configs: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # their paths interpolate it
    with pytest.raises(ConfigError, match="env.should_use_nemo_gym: NeMo Gym rollouts"):
        validated(nemo_rl_configs / f"{name}.yaml", [])


@pytest.mark.e2e
def test_nemo_rl_grpo_math_1b_trains_here(
    prefect_api: None, nemo_rl_configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo RL's own GRPO config, run from its own folder, with the CPU overrides only:
    every stage runs and validation is measured at the end (on the session's Prefect API:
    tests/conftest.py says why one)."""
    from flows.grpo import grpo

    monkeypatch.chdir(nemo_rl_configs.parents[1])  # its prompt_file paths are relative
    overrides = [*CPU_OVERRIDES["grpo_math_1B"], "grpo.max_num_steps=1", "grpo.val_at_end=true"]
    summary = grpo(
        config_path=str(nemo_rl_configs / "grpo_math_1B.yaml"),
        overrides=overrides,
        run_id="nemo-rl-1b",
        storage_root=str(tmp_path / "store"),
    )
    assert summary["iterations"] == [0, 1]
    assert "accuracy" in json.dumps(summary["metrics"][-1])

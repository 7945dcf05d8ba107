"""NeMo RL v0.7.0's own example configs load here with no key removed, and the four the
project promises run on this CPU with overrides of the model, the data and sizes only.

The configs are read at test time from a git mirror of NVIDIA-NeMo/RL (``NEMO_RL_MIRROR``,
default ``../.mirror/NVIDIA-NeMo+RL/repo`` beside the checkout); nothing of NeMo RL is
stored in the project. Without a mirror the tests skip, saying so.
"""

import json
import os
import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.pipeline.registry import pipeline_for_config
from nemo_rl_core.utils.config import ConfigError, load_config_with_overrides
from nemo_rl_core.utils.key_support import Machine, UnsupportedConfigError, check_support

ROOT = Path(__file__).resolve().parents[2]
TAG = "v0.7.0"
EXAMPLE_DIRS = ("configs", "prompts", "modelopt", "nemo_gym")
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
# Model, data and sizes: what a CPU run may change, nothing else (and ppo_math_1B's verifier,
# which is not built here).
SMALL = [
    "policy.model_name=tiny-llama",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=4",
    "policy.max_total_sequence_length=160",
    "policy.precision=float32",
]
SMALL_GRPO = [
    "grpo.num_prompts_per_step=2",
    "grpo.num_generations_per_prompt=4",
    "grpo.max_num_steps=2",
    "grpo.max_val_samples=4",
    "grpo.val_batch_size=4",
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
        "data.train=null",  # NeMo RL's puzzle runner ignores data.train: games come from env
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
}


@pytest.fixture(scope="module")
def nemo_rl_configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mirror = Path(os.environ.get("NEMO_RL_MIRROR", ROOT.parent / ".mirror/NVIDIA-NeMo+RL/repo"))
    if not mirror.exists():
        pytest.skip(f"no NeMo RL mirror at {mirror} (set NEMO_RL_MIRROR)")
    archive = subprocess.run(
        # modelopt/: the ``defaults:`` of NeMo RL's quantization recipes
        ["git", "-C", str(mirror), "archive", TAG, *(f"examples/{d}" for d in EXAMPLE_DIRS)],
        check=True,
        capture_output=True,
    ).stdout
    target = tmp_path_factory.mktemp("nemo_rl")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target / "examples" / "configs"


def validated(path: Path, overrides: list[str]):
    raw = load_config_with_overrides(path, overrides)
    return load_master_config(str(path), overrides, pipeline_for_config(raw).config_class)


@pytest.mark.parametrize("name", LOADING)
def test_nemo_rl_config_loads_with_every_key(nemo_rl_configs: Path, name: str) -> None:
    validated(nemo_rl_configs / f"{name}.yaml", [])


@pytest.mark.parametrize("name", sorted(CPU_OVERRIDES))
def test_promised_configs_run_here_with_model_data_and_size_overrides(
    nemo_rl_configs: Path, name: str
) -> None:
    config = validated(nemo_rl_configs / f"{name}.yaml", CPU_OVERRIDES[name])
    check_support(config, Machine(cuda_devices=0), source=name)


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


def test_an_environment_section_no_dataset_names_loads_and_is_refused(
    nemo_rl_configs: Path,
) -> None:
    """NeMo RL builds only the environments its datasets name, so its DAPO recipes keep an
    env.dapo section no dataset reads (and no environment of that name exists)."""
    name = "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron"
    config = validated(nemo_rl_configs / f"{name}.yaml", [])
    with pytest.raises(UnsupportedConfigError, match="no environment 'dapo' is built here"):
        check_support(config, Machine(cuda_devices=8), source=name)


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
        ("gdpo_math_1B", ["'math_multi_reward': NeMo RL's multi-reward math environment"]),
        ("evals/mmau", ["'mmau': a vision or audio environment"]),
    ],
)
def test_multimodal_and_multi_reward_recipes_load_and_are_refused_by_key(
    nemo_rl_configs: Path, name: str, refusals: list[str]
) -> None:
    """NeMo RL's vision, audio and GDPO recipes name datasets, processors and environments
    of its registries that are not built here: they load, and each such key is refused
    with why before any work."""
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
    nemo_rl_configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo RL's own GRPO config, run from its own folder, with the CPU overrides only:
    every stage runs and validation is measured at the end."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.grpo import grpo

    monkeypatch.chdir(nemo_rl_configs.parents[1])  # its prompt_file paths are relative
    overrides = [*CPU_OVERRIDES["grpo_math_1B"], "grpo.max_num_steps=1", "grpo.val_at_end=true"]
    with prefect_test_harness(server_startup_timeout=120):
        summary = grpo(
            config_path=str(nemo_rl_configs / "grpo_math_1B.yaml"),
            overrides=overrides,
            run_id="nemo-rl-1b",
            storage_root=str(tmp_path / "store"),
        )
    assert summary["iterations"] == [0, 1]
    assert "accuracy" in json.dumps(summary["metrics"][-1])

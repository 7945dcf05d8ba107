"""End to end: the SFT -> GRPO -> eval chain on the embedded default (tiny Llama, built-in
addition data; no server, local storage)."""

from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from flows.chain import DEFAULT_CONFIGS, check_chain, link_overrides, sft_grpo_eval
from nemo_rl_core.utils.config import ConfigError
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
OVERRIDES = [
    "sft:sft.max_num_steps=2",
    "sft:sft.val_at_start=false",
    "grpo:grpo.max_num_steps=2",
    "grpo:grpo.val_at_start=false",
    "grpo:grpo.val_at_end=false",
    "eval:data.num_samples=16",
]


def stored_config(root: Path, run_id: str) -> dict:
    return yaml.safe_load((root / "runs" / run_id / "config.yaml").read_text())


def weights(checkpoint: str) -> dict:
    return load_file(Path(checkpoint) / "model.safetensors")


@pytest.fixture(scope="module")
def chained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("chain")
    return root, sft_grpo_eval(overrides=OVERRIDES, chain_id="c", storage_root=str(root))


def test_each_link_starts_from_the_last_checkpoint_of_the_one_before(chained):
    root, summary = chained
    sft_checkpoint = summary["sft"]["checkpoint"]
    assert sft_checkpoint.endswith("runs/c-sft/checkpoints/step_000002")
    assert summary["grpo"]["started_from"] == sft_checkpoint
    assert stored_config(root, "c-grpo")["policy"]["model_name"] == sft_checkpoint
    grpo_checkpoint = summary["grpo"]["checkpoint"]
    assert grpo_checkpoint.endswith("runs/c-grpo/checkpoints/step_000002")
    assert stored_config(root, "c-eval")["generation"]["model_name"] == grpo_checkpoint
    assert summary["eval"]["scores"]["num_samples"] == 16
    # GRPO trained the SFT weights: its checkpoint holds the same tensors, changed.
    sft_weights, grpo_weights = weights(sft_checkpoint), weights(grpo_checkpoint)
    assert sft_weights.keys() == grpo_weights.keys()
    assert any(not sft_weights[name].equal(grpo_weights[name]) for name in sft_weights)


def test_a_chain_stopped_in_grpo_continues_to_the_same_weights(chained, tmp_path, monkeypatch):
    clean_root, clean = chained
    monkeypatch.setenv(FAULT_ENV, "advantage@1")  # a stage only GRPO has
    with pytest.raises(Exception, match="fault injected into stage 'advantage' of iteration 1"):
        sft_grpo_eval(overrides=OVERRIDES, chain_id="c", storage_root=str(tmp_path))
    assert not (tmp_path / "runs" / "c-eval").exists()
    sft_finished = (tmp_path / "runs" / "c-sft" / "checkpoints").stat().st_mtime_ns
    monkeypatch.delenv(FAULT_ENV)
    resumed = sft_grpo_eval(overrides=OVERRIDES, chain_id="c", storage_root=str(tmp_path))
    assert (tmp_path / "runs" / "c-sft" / "checkpoints").stat().st_mtime_ns == sft_finished
    final, clean_final = (
        weights(resumed["grpo"]["checkpoint"]),
        weights(clean["grpo"]["checkpoint"]),
    )
    assert all(final[name].equal(clean_final[name]) for name in clean_final)
    assert resumed["eval"]["scores"] == clean["eval"]["scores"]


def test_a_bad_link_config_is_refused_before_any_link_runs(tmp_path):
    with pytest.raises(ConfigError, match="eval.*nowhere.jsonl"):
        sft_grpo_eval(
            overrides=[*OVERRIDES, f"eval:data.dataset_name={tmp_path}/nowhere.jsonl"],
            storage_root=str(tmp_path),
        )
    assert not (tmp_path / "runs").exists()


def test_overrides_must_name_their_link():
    assert link_overrides(["grpo:grpo.max_num_steps=3"])["grpo"] == ["grpo.max_num_steps=3"]
    with pytest.raises(ConfigError, match="<link>:<key>=<value>"):
        link_overrides(["grpo.max_num_steps=3"])
    with pytest.raises(ConfigError, match="ppo:x=1"):
        link_overrides(["ppo:x=1"])


def test_the_default_chain_configs_pass_the_check():
    root = Path(__file__).resolve().parents[2]
    configs = {link: str(root / path) for link, path in DEFAULT_CONFIGS.items()}
    check_chain(configs, link_overrides([]))

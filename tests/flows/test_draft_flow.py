"""End to end: NeMo RL's ``policy.draft`` on the embedded default: an SFT run whose policy
trains an Eagle-style draft head beside it (no server, local storage)."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flows.config_check import check_run_config
from flows.sft import sft
from nemo_rl_core.pipeline.algorithms import SFT
from nemo_rl_core.pipeline.spec import declared
from nemo_rl_core.utils.key_support import UnsupportedConfigError
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "sft_tiny.yaml"
STEPS = 3
OVERRIDES = [
    f"sft.max_num_steps={STEPS}",
    "sft.val_period=0",
    "sft.val_at_start=false",
    "policy.draft.enabled=true",
    "policy.draft.loss_weight=1.0",
    "policy.model_name=tiny-llama-arith",  # a trained policy: a sharp distribution to learn
]


def train_metrics(root: Path, run_id: str, iteration: int) -> dict:
    path = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]["train"]["metrics"]


def final_weights(root: Path, run_id: str) -> dict:
    step_dir = root / "runs" / run_id / "checkpoints" / f"step_{STEPS:06d}"
    return {
        "policy": load_file(step_dir / "model.safetensors"),
        "draft": load_file(step_dir / "draft" / "model.safetensors"),
    }


def run(root: Path, run_id: str) -> dict:
    return sft(config_path=str(CONFIG), overrides=OVERRIDES, run_id=run_id, storage_root=str(root))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("draft")
    run(root, "clean")
    return root


def test_draft_loss_drops_and_the_head_is_checkpointed(uninterrupted):
    first = train_metrics(uninterrupted, "clean", 0)["draft_loss"]
    last = train_metrics(uninterrupted, "clean", STEPS - 1)["draft_loss"]
    assert last < 0.8 * first, (first, last)
    weights = final_weights(uninterrupted, "clean")
    assert "fuse.weight" in weights["draft"]
    assert not any(name.startswith("fuse") for name in weights["policy"])


def test_failed_train_resumes_to_identical_policy_and_draft(uninterrupted, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "train@1")
    with pytest.raises(Exception, match="fault injected into stage 'train' of iteration 1"):
        run(tmp_path, "faulty")
    monkeypatch.delenv(FAULT_ENV)
    run(tmp_path, "faulty")
    clean, resumed = final_weights(uninterrupted, "clean"), final_weights(tmp_path, "faulty")
    for part in ("policy", "draft"):
        assert clean[part].keys() == resumed[part].keys()
        for name in clean[part]:
            assert clean[part][name].equal(resumed[part][name]), (part, name)


@pytest.mark.parametrize(
    ("override", "refused"),
    [
        ("policy.draft.model_name=some/eagle3", "policy.draft.model_name='some/eagle3'"),
        ("policy.draft.num_layers=2", "policy.draft.num_layers=2"),
        ("policy.megatron_cfg.enabled=true", "policy.draft.enabled=True: the draft head"),
    ],
)
def test_draft_keys_not_built_are_refused_by_key(override, refused):
    setup = declared(SFT, "data_setup")
    with pytest.raises(UnsupportedConfigError, match=refused):
        check_run_config(SFT.config_class, str(CONFIG), [*OVERRIDES, override], setup)

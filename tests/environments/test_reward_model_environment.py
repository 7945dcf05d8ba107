"""RewardModelEnvironment with a tiny sequence-classification model built here."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from nemo_rl_core.environments.reward_model_environment import RewardModelEnvironment
from nemo_rl_core.environments.utils import create_env

CONVERSATIONS = [
    [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": str(i + c)}]
    for i in range(4)
    for c in (1, 2)
]


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    out = tmp_path_factory.mktemp("rm") / "tiny-rm"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_batched_scores_match_one_at_a_time_and_a_manual_forward(reward_model_dir):
    batched = RewardModelEnvironment({"model_name": str(reward_model_dir), "batch_size": 3})
    single = RewardModelEnvironment({"model_name": str(reward_model_dir), "batch_size": 1})
    scores = batched.score(CONVERSATIONS)
    assert scores.shape == (len(CONVERSATIONS),)
    torch.testing.assert_close(scores, single.score(CONVERSATIONS), atol=1e-5, rtol=1e-5)
    assert len(set(scores.tolist())) == len(CONVERSATIONS)
    text = batched.tokenizer.apply_chat_template(CONVERSATIONS[5], tokenize=False)
    ids = batched.tokenizer(text, return_tensors="pt", add_special_tokens=False)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    with torch.no_grad():
        manual = model(**ids).logits[0, 0]
    torch.testing.assert_close(scores[5], manual, atol=1e-5, rtol=1e-5)


def test_step_returns_scores_as_rewards_and_terminates(reward_model_dir):
    env = create_env("reward_model", {"model_name": str(reward_model_dir), "batch_size": 4})
    result = env.step(CONVERSATIONS[:3], [{}] * 3)
    torch.testing.assert_close(result.rewards, env.score(CONVERSATIONS[:3]))
    assert result.terminateds.all()
    _, metrics = env.global_post_process_and_metrics({"rewards": result.rewards})
    assert metrics["num_samples"] == 3


def test_config_errors_name_the_key(reward_model_dir):
    with pytest.raises(ValueError, match="model_name"):
        RewardModelEnvironment({"batch_size": 2})
    with pytest.raises(ValueError, match="batch_sise"):
        RewardModelEnvironment({"model_name": str(reward_model_dir), "batch_sise": 2})

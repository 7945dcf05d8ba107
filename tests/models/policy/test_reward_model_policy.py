"""HFPolicy as a scalar-head reward model (``policy.reward_model_cfg.enabled``): it trains
with the Bradley-Terry ``PreferenceLossFn`` and saves a checkpoint that transformers'
``AutoModelForSequenceClassification`` loads and scores the same."""

import torch
from policy_testing import policy_config
from transformers import AutoModelForSequenceClassification

from nemo_rl_core.algorithms.loss import PreferenceLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy import make_policy


def pairs(pad_id: int) -> BatchedDataDict:
    """Two pairs, interleaved chosen/rejected, right-padded with the tokenizer's pad id."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([20, 17, 12, 15])
    ids = torch.randint(4, 300, (4, 20), generator=gen)
    ids[torch.arange(20).unsqueeze(0) >= lengths.unsqueeze(1)] = pad_id
    return BatchedDataDict(input_ids=ids, input_lengths=lengths, sample_mask=torch.ones(4))


def test_scalar_head_trains_bradley_terry_and_saves_a_sequence_classifier(tiny_model_dir, tmp_path):
    config = policy_config(tiny_model_dir, reward_model_cfg={"enabled": True})
    policy = make_policy(config, init_reference_model=False)
    data = pairs(policy.tokenizer.pad_token_id)
    loss_fn = PreferenceLossFn()
    start = policy.train(data, loss_fn, eval_mode=True)
    # the head starts at zero: every score is 0, every pair tied
    assert float(start["loss"][0]) == torch.log(torch.tensor(2.0)).item()
    assert sum(start["all_mb_metrics"]["accuracy"]) == 0.0
    for _ in range(8):
        policy.train(data, loss_fn)
    end = policy.train(data, loss_fn, eval_mode=True)
    assert float(end["loss"][0]) < 0.3
    assert sum(end["all_mb_metrics"]["accuracy"]) == 1.0

    policy.save_checkpoint(tmp_path / "rm")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    assert loaded.config.num_labels == 1
    mask = (torch.arange(20).unsqueeze(0) < data["input_lengths"].unsqueeze(1)).long()
    with torch.no_grad():
        scores = loaded(input_ids=data["input_ids"], attention_mask=mask).logits[:, 0]
        policy.model.eval()
        own = policy.model(input_ids=data["input_ids"], attention_mask=mask).logits[:, 0]
    torch.testing.assert_close(scores, own)
    assert (scores[0::2] > scores[1::2]).all()

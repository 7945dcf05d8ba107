"""Bad inputs fail with a message that names the problem; the output layout is NeMo RL's."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.config import GenerationConfig
from nemo_rl_core.models.generation.model_files import (
    RefitMismatchError,
    VocabMismatchError,
    check_refit,
    inspect_model_dir,
)
from nemo_rl_core.models.generation.sequences import (
    PromptTooLongError,
    build_requests,
    pack_generation_outputs,
)
from nemo_rl_core.models.local_models import ModelNotFoundError


def batch(rows: list[list[int]], pad: int = 0, **extra) -> BatchedDataDict:
    width = max(len(r) for r in rows)
    return BatchedDataDict(
        {
            "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            "input_lengths": torch.tensor([len(r) for r in rows]),
            **extra,
        }
    )


def test_model_dir_without_weights_is_rejected(tiny_model_dir: Path, tmp_path: Path):
    empty = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, empty, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(ModelNotFoundError, match="holds no \\*.safetensors or \\*.bin weights"):
        inspect_model_dir(empty)


def test_tokenizer_larger_than_the_embedding_is_rejected(tiny_model_dir: Path, tmp_path: Path):
    shrunk = tmp_path / "shrunk-vocab"
    shutil.copytree(tiny_model_dir, shrunk)
    config = json.loads((shrunk / "config.json").read_text())
    config["vocab_size"] = 100
    (shrunk / "config.json").write_text(json.dumps(config))
    with pytest.raises(VocabMismatchError, match="config.json vocab_size is 100"):
        inspect_model_dir(shrunk)


def test_prompts_are_checked_and_budgets_cut():
    config = GenerationConfig(max_new_tokens=8, stop_strings=["</answer>"])
    requests = build_requests(
        batch([[1, 2, 3], [4, 5, 6, 7, 8, 9]], stop_strings=[None, ["\n"]]), config, 50, 12
    )
    assert requests.prompts == [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert requests.max_tokens == [8, 6]
    assert requests.stop_strings == [["</answer>"], ["</answer>", "\n"]]
    with pytest.raises(PromptTooLongError, match="prompt 1 has 6 tokens but max_model_len is 6"):
        build_requests(batch([[1], [1] * 6]), config, 50, 6)
    with pytest.raises(ValueError, match=r"prompt 0 holds token ids \[77\] outside"):
        build_requests(batch([[1, 77]]), config, 50, 12)
    with pytest.raises(ValueError, match="input_lengths\\[0\\]=0 must be in 1..2"):
        build_requests(
            BatchedDataDict(
                {
                    "input_ids": torch.ones(1, 2, dtype=torch.long),
                    "input_lengths": torch.tensor([0]),
                }
            ),
            config,
            50,
            12,
        )
    with pytest.raises(ValueError, match="stop_strings'\\] has 1 entries for a batch of 2"):
        build_requests(batch([[1], [2]], stop_strings=[["x"]]), config, 50, 12)


def test_outputs_are_prompt_then_response_right_padded():
    data = batch([[1, 2, 3], [4]], pad=9)
    out = pack_generation_outputs(
        data, [[5], [6, 7, 8]], [[-0.5], [-1.0, -2.0, -3.0]], 9, [False, True]
    )
    assert out["output_ids"].tolist() == [[1, 2, 3, 5, 9, 9], [4, 6, 7, 8, 9, 9]]
    assert out["logprobs"].tolist() == [[0, 0, 0, -0.5, 0, 0], [0, -1.0, -2.0, -3.0, 0, 0]]
    assert out["generation_lengths"].tolist() == [1, 3]
    assert out["unpadded_sequence_lengths"].tolist() == [4, 4]


def test_refit_check_names_missing_unexpected_and_misshapen_weights():
    expected = {
        "a": ((2, 2), "float32"),
        "b": ((3,), "float32"),
        "lm_head.weight": ((4, 2), "float32"),
    }
    check_refit(
        {"a": ((2, 2), "bfloat16"), "b": ((3,), "float32")}, expected, tied=True, source="x"
    )
    with pytest.raises(
        RefitMismatchError, match=r"missing 1 weights \(first: \['lm_head.weight'\]\)"
    ):
        check_refit(
            {"a": ((2, 2), "float32"), "b": ((3,), "float32")}, expected, tied=False, source="x"
        )
    with pytest.raises(
        RefitMismatchError, match=r"unexpected 1 weights.*wrong shapes: \['b: \(4,\) != \(3,\)'\]"
    ):
        check_refit(
            {"a": ((2, 2), "float32"), "b": ((4,), "float32"), "c": ((1,), "float32")},
            expected,
            tied=True,
            source="x",
        )

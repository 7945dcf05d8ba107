"""Builders for policy tests: configs on the tiny local models and fixed token batches."""

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

from nemo_rl_core.algorithms.grpo import MasterConfig, load_master_config
from nemo_rl_core.algorithms.ppo import PPOMasterConfig
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.utils.key_support import Machine, UnsupportedConfigError, check_support

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "examples" / "configs"
NO_GPU, ONE_GPU = Machine(cuda_devices=0), Machine(cuda_devices=1)


def policy_config(model_dir: Path, **overrides: Any) -> PolicyConfig:
    """fp32, AdamW without weight decay, gbs 4 / mbs 2, on a local model directory."""
    base: dict[str, Any] = {
        "model_name": str(model_dir),
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 2,
        "max_total_sequence_length": 32,
        "precision": "float32",
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-3, "weight_decay": 0.0}},
    }
    return PolicyConfig.model_validate({**base, **overrides})


def token_batch(batch: int = 4, seq: int = 24, vocab: int = 500, seed: int = 0) -> BatchedDataDict:
    """Right-padded random sequences of different lengths; the last third is the 'response'."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq // 3, seq + 1, (batch,), generator=gen)
    lengths[0] = seq
    ids = torch.randint(4, vocab, (batch, seq), generator=gen)
    positions = torch.arange(seq).unsqueeze(0)
    valid = positions < lengths.unsqueeze(1)
    ids = ids * valid
    prompt = (lengths * 2 // 3).unsqueeze(1)
    token_mask = (valid & (positions >= prompt)).float()
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=lengths,
        token_mask=token_mask,
        sample_mask=torch.ones(batch),
    )


def manual_logprobs(model_dir: Path, data: BatchedDataDict) -> torch.Tensor:
    """Reference: plain transformers forward + log_softmax gather, position 0 and padding 0."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids, lengths = data["input_ids"], data["input_lengths"]
    valid = torch.arange(ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=valid.long()).logits
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0)) * valid


def support_refusals(config_name: str, overrides: list[str], machine: Machine) -> str:
    """What ``check_support`` refuses of an example config with ``overrides`` ('' if nothing)."""
    config_class = PPOMasterConfig if config_name.startswith("ppo") else MasterConfig
    config = load_master_config(str(CONFIGS / config_name), overrides, config_class)
    try:
        check_support(config, machine, source=config_name)
    except UnsupportedConfigError as err:
        return str(err)
    return ""


_RANK_PROGRAM = textwrap.dedent(
    """
    import importlib
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist

    tests, test_file, model_dir, out = (Path(arg) for arg in sys.argv[1:5])
    sys.path[:0] = [str(tests), str(test_file.parent)]
    from nemo_rl_core.distributed.world import init_rank

    init_rank(timeout_s=300)
    results = importlib.import_module(test_file.stem).compute(model_dir)
    torch.save(results, out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()
    """
)


def run_on_ranks(ranks: int, test_file: str, model_dir: Path, out: Path) -> list[Any]:
    """``compute(model_dir)`` of the test module at ``test_file`` on ``ranks`` gloo ranks
    (torchrun --standalone): each rank's result, in rank order."""
    program = out / "rank_program.py"
    program.write_text(_RANK_PROGRAM)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    arguments = [str(Path(__file__).parent), test_file, str(model_dir), str(out)]
    subprocess.run(
        [*command, f"--nproc-per-node={ranks}", str(program), *arguments],
        check=True,
        cwd=ROOT,
        timeout=600,
    )
    return [torch.load(out / f"rank{rank}.pt") for rank in range(ranks)]

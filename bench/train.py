"""Train-step throughput, Megatron backend vs HF backend, same weights, batch, loss and AdamW.

Both policies run in this process (Megatron at world size 1); steps alternate between the
backends so machine load hits both alike. Tokens/s counts the batch's real (unpadded)
tokens per ``policy.train`` call; figures are medians over the timed steps.

Run:   .venv/bin/python bench/train.py            (tiny model and a ~100M Llama)
Smoke: .venv/bin/python bench/train.py --smoke    (tiny model, two steps)
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import cpu_model  # first: it sets the process defaults before torch loads

# isort: split
import torch

from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.local_models import build_tiny_model
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.models.policy.hf_policy import HFPolicy
from nemo_rl_core.models.policy.megatron_policy import MegatronPolicy

MODELS = {
    "tiny (2x64)": {},
    "~100M llama (16x768)": {
        "hidden_size": 768,
        "num_layers": 16,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 2048,
    },
}


def _config(model_dir: Path, backend: str, batch: int, seq: int) -> PolicyConfig:
    lr = 1e-5
    config = {
        "model_name": str(model_dir),
        "train_global_batch_size": batch,
        "train_micro_batch_size": batch,
        "max_total_sequence_length": seq,
        "precision": "float32",
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": lr, "weight_decay": 0.0}},
    }
    if backend == "megatron":
        config["megatron_cfg"] = {
            "enabled": True,
            "optimizer": {"lr": lr, "min_lr": lr, "weight_decay": 0.0},
            "scheduler": {"lr_warmup_iters": 0, "lr_warmup_init": lr},
        }
    return PolicyConfig(**config)


def _batch(vocab: int, batch: int, seq: int) -> BatchedDataDict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    return BatchedDataDict(
        {
            "input_ids": ids,
            "input_lengths": torch.full((batch,), seq),
            "token_mask": torch.ones(batch, seq),
            "sample_mask": torch.ones(batch),
        }
    )


def _measure(model_dir: Path, batch: int, seq: int, steps: int) -> dict[str, float]:
    """Median tokens/s per backend over ``steps`` alternating steps (after one warm-up each)."""
    policies = {
        "megatron": MegatronPolicy(_config(model_dir, "megatron", batch, seq)),
        "hf": HFPolicy(_config(model_dir, "hf", batch, seq)),
    }
    data = _batch(len(policies["hf"].tokenizer), batch, seq)
    loss_fn = NLLLossFn()
    times: dict[str, list[float]] = {name: [] for name in policies}
    for step in range(steps + 1):
        for name, policy in policies.items():
            start = time.perf_counter()
            policy.train(data, loss_fn)
            if step:  # step 0 warms up allocators and imports
                times[name].append(time.perf_counter() - start)
    for policy in policies.values():
        policy.shutdown()
    tokens = int(data["input_lengths"].sum())
    return {name: tokens / statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, two timed steps")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per backend")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    models = {"tiny (2x64)": MODELS["tiny (2x64)"]} if args.smoke else MODELS
    steps = 2 if args.smoke else args.steps
    print(
        f"cpu: {cpu_model()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"batch {args.batch}x{args.seq}, {steps} timed steps, load avg {os.getloadavg()[0]:.1f}"
    )
    print(f"{'model':<24}{'megatron tok/s':>16}{'hf tok/s':>12}{'megatron/hf':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, shape in models.items():
            model_dir = build_tiny_model(Path(tmp) / label.split()[0], "llama", **shape)
            rates = _measure(model_dir, args.batch, args.seq, steps)
            ratio = rates["megatron"] / rates["hf"]
            print(f"{label:<24}{rates['megatron']:>16.1f}{rates['hf']:>12.1f}{ratio:>13.2f}")


if __name__ == "__main__":
    main()

"""HFPolicy throughput with padded, dynamic-batching and packed microbatches, side by side.

RL batches are ragged (short and long responses mixed); padding every microbatch to its
longest sample wastes compute that dynamic batching (sorted token budgets) and packing
(one row, block-diagonal attention) save. Same data, same model, one run each.

    .venv/bin/python bench/policy_batching.py                       # tiny Llama (4x256)
    .venv/bin/python bench/policy_batching.py --model smollm2-135m-instruct --no-train
"""

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from nemo_rl_core.algorithms.loss import NLLLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.local_models import build_tiny_model, resolve_model
from nemo_rl_core.models.policy import PolicyConfig, make_policy


def ragged_batch(batch: int, max_len: int, vocab: int, seed: int = 0) -> BatchedDataDict:
    """Lengths uniform in [max_len/16, max_len]: a typical spread of RL rollouts."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(max_len // 16, 2), max_len + 1, (batch,), generator=gen)
    positions = torch.arange(max_len).unsqueeze(0)
    valid = positions < lengths.unsqueeze(1)
    ids = torch.randint(4, vocab, (batch, max_len), generator=gen) * valid
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=lengths,
        token_mask=(valid & (positions > 0)).float(),
        sample_mask=torch.ones(batch),
    )


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def measure(
    config: PolicyConfig, data: BatchedDataDict, repeats: int, train: bool
) -> dict[str, float]:
    """Seconds per get_logprobs (and per train step) of a fresh policy."""
    policy = make_policy(config, init_reference_model=False, init_optimizer=train)
    seconds = {"logprobs": timed(lambda: policy.get_logprobs(data), repeats)}
    if train:
        seconds["train"] = timed(lambda: policy.train(data, NLLLossFn()), repeats)
    policy.shutdown()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="model name/dir (default: a 4x256 tiny Llama)"
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-train", action="store_true", help="time get_logprobs only")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None:
            model_dir = build_tiny_model(
                Path(scratch) / "tiny", hidden_size=256, num_layers=4, intermediate_size=512
            )
        else:
            model_dir = resolve_model(args.model)
        budget = args.max_len * args.mbs
        modes = {
            "padded": {},
            "dynamic": {
                "dynamic_batching": {
                    "enabled": True,
                    "train_mb_tokens": budget,
                    "logprob_mb_tokens": budget,
                    "sequence_length_round": 16,
                }
            },
            "packed": {
                "sequence_packing": {
                    "enabled": True,
                    "train_mb_tokens": budget,
                    "logprob_mb_tokens": budget,
                    "sequence_length_round": 16,
                }
            },
        }
        results: dict[str, dict[str, float]] = {}
        for mode, section in modes.items():
            config = PolicyConfig.model_validate(
                {
                    "model_name": str(model_dir),
                    "train_global_batch_size": args.batch,
                    "train_micro_batch_size": args.mbs,
                    "logprob_batch_size": args.mbs,
                    "max_total_sequence_length": args.max_len,
                    "precision": args.precision,
                    **section,
                }
            )
            data = ragged_batch(args.batch, args.max_len, vocab=500)
            results[mode] = measure(config, data, args.repeats, train=not args.no_train)

    real_tokens = int(data["input_lengths"].sum())
    print(
        f"model {model_dir.name}, batch {args.batch}, max_len {args.max_len}, mbs {args.mbs}, "
        f"{args.precision}, {real_tokens} real tokens of {args.batch * args.max_len}"
    )
    for phase in results["padded"]:
        padded = results["padded"][phase]
        line = ", ".join(
            f"{mode} {results[mode][phase] * 1000:.0f} ms ({real_tokens / results[mode][phase]:.0f} tok/s)"
            for mode in results
        )
        ratios = ", ".join(
            f"padded/{mode} {padded / results[mode][phase]:.2f}x" for mode in ("dynamic", "packed")
        )
        print(f"{phase}: {line}; {ratios}")
    print(f"cpu: {platform.machine()}, torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()

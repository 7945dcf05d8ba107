"""Against the machine's limit: achieved FLOP/s of the GRPO train step and logprob stage as a
fraction of a large fp32 / bf16 matmul's FLOP/s on the same cores, in the same run.

FLOPs are counted, not estimated: ``torch.utils.flop_counter.FlopCounterMode`` records the
matmuls and attention of one counted call (forward and backward), then the same call is
timed without the counter. Each repeat times the two matmuls, one train step (GRPO's
clipped-PG loss, AdamW, micro-batched as configured) and the logprob stage in its three
configurations (2, 1 or 0 model forwards: see ``LOGPROB_STAGES``) back to back, so machine
load hits all of them alike.

Run:   .venv/bin/python bench/roofline.py            (tiny Llama and SmolLM2-135M)
Smoke: .venv/bin/python bench/roofline.py --smoke    (tiny Llama, small batch, 1 repeat)
"""

import argparse
import time
from collections.abc import Callable

from common import (  # first: process defaults before torch loads
    TINY_CONFIG,
    machine_line,
    median,
    record,
)

# isort: split
import torch
from torch.utils.flop_counter import FlopCounterMode

from nemo_rl_core.algorithms import grpo
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.models.policy import make_policy


def counted_flops(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def matmul(n: int, dtype: torch.dtype) -> tuple[Callable[[], object], int]:
    """A square ``n`` matmul and its FLOPs (2 n^3)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return (lambda: torch.mm(a, b)), 2 * n**3


# The logprob stage as each config runs it: NeMo RL's default computes prev_logprobs and
# the reference's; loss_fn.force_on_policy_ratio skips the first; with a KL penalty of 0,
# grpo.skip_reference_policy_logprobs_calculation skips the second (bench/vs_trl.py's setup).
LOGPROB_STAGES = {
    "logprob stage 2 fwd": [],
    "logprob stage 1 fwd": ["loss_fn.force_on_policy_ratio=true"],
    "logprob stage 0 fwd": [
        "loss_fn.force_on_policy_ratio=true",
        "loss_fn.reference_policy_kl_penalty=0",
        "grpo.skip_reference_policy_logprobs_calculation=true",
    ],
}


def rollouts(vocab: int, batch: int, seq: int) -> BatchedDataDict:
    """Scored rollouts of random tokens, the first half of each the prompt."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    logs = [
        [
            {"role": "user", "token_ids": row[: seq // 2]},
            {"role": "assistant", "token_ids": row[seq // 2 :]},
        ]
        for row in ids
    ]
    return BatchedDataDict(
        message_log=logs,
        loss_multiplier=torch.ones(batch),
        total_reward=torch.rand(batch, generator=gen),
        prompt_index=torch.arange(batch),
    )


def grpo_stages(model: str, batch: int, seq: int, micro: int) -> dict[str, Callable[[], object]]:
    """The train step and the logprob stage (per config) of one GRPO iteration on ``model``,
    through the stage functions the flow calls."""
    overrides = [
        f"policy.model_name={resolve_model(model)}",
        f"policy.train_global_batch_size={batch}",
        f"policy.train_micro_batch_size={micro}",
        f"policy.logprob_batch_size={micro}",
        f"policy.max_total_sequence_length={seq}",
        "policy.precision=float32",
        "policy.optimizer.kwargs.lr=1.0e-6",
        f"grpo.num_prompts_per_step={batch}",
        "grpo.num_generations_per_prompt=1",
    ]
    configs = {
        name: grpo.load_master_config(TINY_CONFIG, overrides + extra)
        for name, extra in LOGPROB_STAGES.items()
    }
    config = configs["logprob stage 2 fwd"]  # KL penalty 0.01: the train step reads both
    policy = make_policy(config.policy, init_reference_model=True)
    tokenizer = policy.tokenizer

    def logprob_stage(stage_config) -> Callable[[], object]:
        return lambda: grpo.compute_logprobs(
            policy, rollouts(len(tokenizer), batch, seq), tokenizer, stage_config
        )

    data = logprob_stage(config)()
    data["advantages"] = torch.randn(data["token_mask"].shape) * data["token_mask"]
    loss_fn = grpo.build_loss_fn(config)

    def train() -> None:
        policy.prepare_for_training()
        policy.train(data, loss_fn)
        policy.finish_training()

    return {"train step": train} | {
        name: logprob_stage(stage_config) for name, stage_config in configs.items()
    }


def measure(
    model: str, batch: int, seq: int, micro: int, repeats: int, sizes: tuple[int, int]
) -> dict:
    """Median seconds and counted FLOPs of each workload, interleaved per repeat;
    ``sizes``: the fp32 and bf16 matmul sizes."""
    workloads = {f"matmul fp32 {sizes[0]}": matmul(sizes[0], torch.float32)}
    workloads[f"matmul bf16 {sizes[1]}"] = matmul(sizes[1], torch.bfloat16)
    for name, fn in grpo_stages(model, batch, seq, micro).items():
        workloads[name] = (fn, counted_flops(fn))
    for fn, _ in workloads.values():  # warm-up: allocators, kernels, lazy imports
        fn()
    times: dict[str, list[float]] = {name: [] for name in workloads}
    for _ in range(repeats):
        for name, (fn, _) in workloads.items():
            times[name].append(seconds(fn))
    return {
        name: {"seconds": median(times[name]), "flops": flops}
        for name, (_, flops) in workloads.items()
    }


def format_table(label: str, results: dict) -> str:
    names = list(results)
    peak32, peak16 = (results[n]["flops"] / results[n]["seconds"] for n in names[:2])
    lines = [label, f"{'workload':<20}{'GFLOP':>9}{'s':>8}{'GFLOP/s':>9}{'/fp32':>9}{'/bf16':>9}"]
    for name, r in results.items():
        rate = r["flops"] / r["seconds"]
        lines.append(
            f"{name:<20}{r['flops'] / 1e9:>9.2f}{r['seconds']:>8.3f}{rate / 1e9:>9.2f}"
            f"{rate / peak32:>9.1%}{rate / peak16:>9.0%}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, batch 4x32, 1 repeat")
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "smollm2-135m-instruct"])
    parser.add_argument("--batch", type=int, default=16, help="sequences per train step")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--micro", type=int, default=8, help="micro batch (train and logprob)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul", type=int, default=2048, help="fp32 square matmul size")
    # Without AVX512-BF16/AMX, torch's CPU bf16 matmul runs at well under 1 GFLOP/s: a
    # 2048 one would take minutes, and its rate barely depends on the size.
    parser.add_argument("--matmul-bf16", type=int, default=512, help="bf16 matmul size")
    args = parser.parse_args()
    if args.smoke:
        args.models, args.batch, args.seq, args.micro = ["tiny-llama"], 4, 32, 4
        args.repeats, args.matmul, args.matmul_bf16 = 1, 256, 128
    print(f"{machine_line()}, torch threads {torch.get_num_threads()}", flush=True)
    tables = []
    for model in args.models:
        sizes = (args.matmul, args.matmul_bf16)
        results = measure(model, args.batch, args.seq, args.micro, args.repeats, sizes)
        label = f"{model}: batch {args.batch}x{args.seq} tokens, micro batch {args.micro}, fp32"
        tables.append(format_table(label, results))
        print(tables[-1], flush=True)
    record(
        "Roofline: GRPO train step and logprob stage vs a large matmul (issue 8)",
        "\n\n".join(tables),
        f"Medians of {args.repeats} interleaved repeats; '/fp32' and '/bf16' are the achieved "
        "FLOP/s as a fraction of the square matmul's in that precision, on the same threads.",
        args.smoke,
    )


if __name__ == "__main__":
    main()

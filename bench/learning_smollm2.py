"""A real pretrained model learns real math (issue 31): SmolLM2-135M-Instruct's held-out greedy
accuracy on two-digit additions before and after GRPO, with a reward the question cannot earn.

The task asks "What is 51 + 29? End your response with the line "Answer: <number>"." and NeMo
RL's DAPO check (``math_verify_impl: dapo_math_verify``) scores the last ``Answer:`` line
against the sum as a string, so a restated question ("Answer: 51 + 29") scores 0, where
math-verify scored ``\\boxed{51 + 29}`` 1 (the gamed run of issue 19). SmolLM2 answers
"51 + 29 = 80" and never writes the line, so the chain's SFT link teaches the format first
(``sft_smollm2_answer_line.yaml``, training pairs only).

Per seed (``sft.seed`` and ``grpo.seed``): the SFT -> GRPO -> eval chain (``flows.chain``),
then the eval flow on SFT's checkpoint. ``--sft-seed N``: one warm start for every seed, as
``bench/learning.py`` has: the SFT link of seed N's chain (run once, kept and found again),
each other seed its GRPO flow and eval flow from that checkpoint, so seeds differ only in
GRPO's seed (its sampling and prompt order). 'start' is SFT's held-out greedy accuracy, 'end'
GRPO's, both from the eval flow on the same 256 held-out additions (pairs no SFT or GRPO run
draws); the gain counted is GRPO's over its start. Each GRPO run's stored rollouts
(``rollouts/iter_*.parquet``) and both evals' samples are then audited: what the rewarded
answers are made of (correct bare numbers, numbers after a worked sum, wrong numbers,
restated expressions, no answer line).

``--trl SEED``: TRL's GRPOTrainer (``bench/vs_trl.py``'s worker, in its venv) from that seed's
SFT checkpoint, on the prompts our GRPO run drew, in order, with the same DAPO reward and
update settings; its final weights are scored by the same eval flow. ``--trl-minutes M``:
TRL stops after the first step that ends past M minutes of training and its weights so far
are scored (a wall budget on a loaded machine, where its steps have taken 40-580 s).
``--trl-only``: TRL alone, for the ``--trl`` seeds whose runs a ``--keep`` folder already holds
(beside a run still going: each TRL result is kept in its own ``trl_s<seed>/result.json``).
``--validation``: score training-side pairs of another seed instead of the held-out ones
(the split the recipe's settings were chosen on; the held-out pairs chose nothing).

Run:   nice -n 5 .venv/bin/python bench/learning_smollm2.py --seeds 1 2 3 --sft-seed 1 --trl 1 --keep DIR
Again: .venv/bin/python bench/learning_smollm2.py --summarize DIR   (the tables of a kept run)
TRL:   .venv/bin/python bench/learning_smollm2.py --trl 1 --trl-only --keep DIR
Smoke: .venv/bin/python bench/learning_smollm2.py --smoke    (1+2 small steps, 4 problems)
"""

import argparse
import itertools
import json
import os
import re
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import command_line, flow_curves, flow_iteration_times, machine_line, median, record

CONFIGS = {
    "sft": "examples/configs/sft_smollm2_answer_line.yaml",
    "grpo": "examples/configs/grpo_smollm2_answer_line.yaml",
    "eval": "examples/configs/eval_smollm2_answer_line.yaml",
}
# Training-side additions of a seed no SFT or GRPO run draws its pairs from: the validation
# split that settings were chosen on (some of its pairs may also be training pairs).
VALIDATION = ["data.split=train", "data.seed=777", "data.num_samples=128"]
# The smoke's batches are small enough that a step takes seconds, not tens of seconds.
SMOKE_BATCH = ["policy.train_micro_batch_size=4", "policy.logprob_batch_size=4"]
SMOKE = {
    "sft": [  # one step: its checkpoint is the start either way
        "sft.max_num_steps=1",
        "data.train.num_samples=4",
        "policy.train_global_batch_size=4",
        *SMOKE_BATCH,
    ],
    "grpo": [
        "grpo.max_num_steps=2",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "policy.train_global_batch_size=4",
        *SMOKE_BATCH,
        "policy.generation.backend=hf",
    ],
    # HF generates 4 short answers in seconds; a vLLM engine starts in ~20 s per eval, and the
    # eval flow on vLLM is tests/flows/test_eval_flow.py's.
    "eval": ["data.num_samples=4", "generation.backend=hf"],
}
AUDIT_WINDOW = 5  # GRPO steps compared at the start and at the end of a run
KINDS = (
    "right number",  # the Answer line holds the sum as a bare number
    "right, worked",  # ... a worked sum ending in it ("51 + 29 = 80")
    "wrong number",
    "restated",  # ... an expression without its result ("51 + 29"): the gamed answer
    "other",
    "no Answer",  # no "Answer:" line at all
)
BASE_EVAL = "base-eval"  # the eval run of SmolLM2-135M-Instruct itself
RESULTS_FILE = "results.json"  # what a --keep folder holds besides the runs
TRL_RESULT = "result.json"  # in a TRL run's own folder, trl_s<seed>


def answer_kind(response: str, ground_truth: str) -> str:
    """What a response's last ``Answer:`` line holds, read as DAPO's check reads it."""
    from nemo_rl_core.environments.dapo_math_verifier import (
        ANSWER_PATTERN,
        SCORED_TAIL,
        normalize_final_answer,
    )

    lines = re.findall(ANSWER_PATTERN, response[-SCORED_TAIL:])
    if not lines:
        return "no Answer"
    written = lines[-1].strip()
    bare = re.fullmatch(r"\d+\.?", written) is not None
    if normalize_final_answer(written) == normalize_final_answer(ground_truth):
        return "right number" if bare else "right, worked"
    if bare:
        return "wrong number"
    return "restated" if re.search(r"\d\s*[-+*/]\s*\d", written) else "other"


def last_number_right(response: str, ground_truth: str) -> bool:
    """Whether the response's last number is the sum, whatever its format (what a lenient
    last-number check would reward)."""
    numbers = re.findall(r"\d+", response)
    return bool(numbers) and numbers[-1] == ground_truth


def audit_rows(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Shares of each answer kind, of last numbers that are the sum, the mean reward and the
    mean response tokens of ``rows`` (rollout-table rows: response, ground_truth, reward,
    response_tokens)."""
    kinds = Counter(answer_kind(r["response"], r["ground_truth"]) for r in rows)
    return {
        "reward": statistics.mean(r["reward"] for r in rows),
        **{kind: kinds[kind] / len(rows) for kind in KINDS},
        "last num right": statistics.mean(
            last_number_right(r["response"], r["ground_truth"]) for r in rows
        ),
        "tokens": statistics.mean(r["response_tokens"] for r in rows),
    }


def eval_samples(root: Path, run_id: str) -> list[dict[str, Any]]:
    """Every sample of an eval run kept under ``root``."""
    import pyarrow.parquet as pq

    return pq.read_table(root / "evals" / run_id / "evaluation_data.parquet").to_pylist()


def eval_audit(root: Path, run_id: str) -> dict[str, float]:
    """``audit_rows`` of every sample of an eval run kept under ``root``."""
    return audit_rows(eval_samples(root, run_id))


def flips(root: Path, start_eval: str, end_eval: str) -> tuple[int, int]:
    """Held-out problems the end answers right and the start wrong, and the reverse: a gain
    made of many won and few lost problems is no reshuffle of a fixed accuracy."""
    start = {row["prompt_index"]: row["reward"] > 0 for row in eval_samples(root, start_eval)}
    end = {row["prompt_index"]: row["reward"] > 0 for row in eval_samples(root, end_eval)}
    won = sum(end[i] and not start[i] for i in start)
    lost = sum(start[i] and not end[i] for i in start)
    return won, lost


def flip_table(results: dict[str, Any], root: Path) -> str:
    """Per seed and side: held-out problems won and lost from the start to the end."""
    lines = [f"{'side':<8}{'seed':>5}{'won':>6}{'lost':>6}  (held-out problems, start -> end)"]
    for run in results["runs"]:
        ends = {"ours": run["end_eval"]}
        if str(run["seed"]) in results["trl"]:
            ends["TRL"] = results["trl"][str(run["seed"])]["end_eval"]
        for side, end_eval in ends.items():
            won, lost = flips(root, run["start_eval"], end_eval)
            lines.append(f"{side:<8}{run['seed']:>5}{won:>6}{lost:>6}")
    return "\n".join(lines)


def rollout_audit(root: Path, grpo_run: str) -> dict[str, dict[str, float]]:
    """``audit_rows`` of the first and the last ``AUDIT_WINDOW`` steps' stored rollouts."""
    import pyarrow.parquet as pq

    rollouts = sorted((root / "logs" / grpo_run / "rollouts").glob("iter_*.parquet"))
    steps = [pq.read_table(path).to_pylist() for path in rollouts]
    window = min(AUDIT_WINDOW, max(1, len(steps) // 2))
    first = [row for step in steps[:window] for row in step]
    last = [row for step in steps[-window:] for row in step]
    return {f"steps 1-{window}": audit_rows(first), f"last {window}": audit_rows(last)}


def evaluate(model: str, overrides: list[str], run_id: str, root: Path) -> float:
    """The eval flow on ``model``: its greedy accuracy (samples kept under ``root/evals``)."""
    from flows.eval import evaluate as eval_flow

    result = eval_flow(
        config_path=CONFIGS["eval"],
        overrides=[*overrides, f"generation.model_name={model}", f"eval.save_path={root}/evals"],
        run_id=run_id,
        storage_root=f"file://{root}/store",
    )
    return float(result["scores"]["pass@1"])


def link_overrides(seed: int, eval_overrides: list[str], smoke: bool, root: Path) -> list[str]:
    """The chain's ``<link>:<key>=<value>`` overrides of one seed."""
    per_link = {
        "sft": [f"sft.seed={seed}", f"logger.log_dir={root}/logs"],
        "grpo": [f"grpo.seed={seed}", f"logger.log_dir={root}/logs"],
        "eval": [*eval_overrides, f"eval.save_path={root}/evals"],
    }
    for link, extra in SMOKE.items():
        if smoke:
            per_link[link] += extra
    return [f"{link}:{item}" for link, items in per_link.items() for item in items]


def chain_id(seed: int) -> str:
    """The chain of ``seed`` with its own SFT start; its SFT link is the shared warm start
    when ``--sft-seed`` names this seed."""
    return f"smollm2-answer-s{seed}"


def run_chain(seed: int, eval_overrides: list[str], smoke: bool, root: Path) -> dict[str, Any]:
    """The SFT -> GRPO -> eval chain of one seed: its SFT checkpoint, GRPO run and end."""
    from flows.chain import sft_grpo_eval

    summary = sft_grpo_eval(
        sft_config=CONFIGS["sft"],
        grpo_config=CONFIGS["grpo"],
        eval_config=CONFIGS["eval"],
        overrides=link_overrides(seed, eval_overrides, smoke, root),
        chain_id=chain_id(seed),
        storage_root=f"file://{root}/store",
    )
    return {
        "sft_checkpoint": summary["sft"]["checkpoint"],
        "grpo_run": summary["grpo"]["run_id"],
        "end_eval": summary["eval"]["run_id"],
        "end": summary["eval"]["scores"]["pass@1"],
    }


def run_from_warm_start(
    seed: int, sft_seed: int, eval_overrides: list[str], smoke: bool, root: Path
) -> dict[str, Any]:
    """GRPO of ``seed`` from the SFT link of ``sft_seed``'s chain (run here if no run has
    committed it yet; a finished one has nothing to do), then the eval of GRPO's last
    checkpoint: the chain's links, run one by one so that seeds share the first."""
    from flows.chain import final_checkpoint
    from flows.chain import link_overrides as split_links
    from flows.grpo import grpo
    from flows.sft import sft

    store = f"file://{root}/store"
    sft_run = f"{chain_id(sft_seed)}-sft"
    sft_overrides = split_links(link_overrides(sft_seed, eval_overrides, smoke, root))["sft"]
    sft(config_path=CONFIGS["sft"], overrides=sft_overrides, run_id=sft_run, storage_root=store)
    checkpoint = final_checkpoint(store, sft_run, chain_id(sft_seed), "sft")
    links = split_links(link_overrides(seed, eval_overrides, smoke, root))
    run_id = f"{chain_id(seed)}-from-sft{sft_seed}"
    grpo_run, end_eval = f"{run_id}-grpo", f"{run_id}-eval"
    grpo_overrides = [*links["grpo"], f"policy.model_name={checkpoint}"]
    grpo(config_path=CONFIGS["grpo"], overrides=grpo_overrides, run_id=grpo_run, storage_root=store)
    end_model = final_checkpoint(store, grpo_run, run_id, "grpo")
    end = evaluate(end_model, eval_overrides, end_eval, root)
    return {"sft_checkpoint": checkpoint, "grpo_run": grpo_run, "end_eval": end_eval, "end": end}


def run_seed(
    seed: int, sft_seed: int | None, eval_overrides: list[str], smoke: bool, root: Path
) -> dict[str, Any]:
    """One seed's GRPO from its start (its own SFT, or ``sft_seed``'s), then the eval of
    that start: accuracies, run ids, times."""
    from nemo_rl_core.storage.run_storage import RunStorage

    started = time.perf_counter()
    if sft_seed is None or sft_seed == seed:
        run = run_chain(seed, eval_overrides, smoke, root)
    else:
        run = run_from_warm_start(seed, sft_seed, eval_overrides, smoke, root)
    start_eval = f"{chain_id(sft_seed or seed)}-eval-start"  # a finished eval is found again
    start = evaluate(run["sft_checkpoint"], eval_overrides, start_eval, root)
    storage = RunStorage(f"file://{root}/store", run["grpo_run"])
    manifests = [storage.read_manifest(i) for i in storage.iterations()]
    return {
        "seed": seed,
        "sft_seed": sft_seed or seed,
        **run,
        "start_eval": start_eval,
        "start": start,
        "minutes": (time.perf_counter() - started) / 60,
        "step_seconds": median([t["total"] for t in flow_iteration_times(manifests)]),
        "rewards": flow_curves(manifests)["reward"],
    }


def run_trl(
    run: dict[str, Any],
    eval_overrides: list[str],
    smoke: bool,
    root: Path,
    budget_minutes: float | None = None,
) -> dict:
    """TRL's GRPOTrainer from ``run``'s SFT checkpoint on the prompts its GRPO run drew (the
    same seed's batches, in order), then the eval flow on TRL's final weights: those of its
    last step, or of the first step that ends past ``budget_minutes`` of training."""
    from vs_trl import ensure_trl_venv, settings_from_config, start_trl

    checkpoint = run["sft_checkpoint"]
    overrides = [f"grpo.seed={run['seed']}", f"policy.model_name={checkpoint}"]
    settings = settings_from_config(
        CONFIGS["grpo"], overrides + (SMOKE["grpo"] if smoke else []), checkpoint
    )
    workdir = root / f"trl_s{run['seed']}"
    if (workdir / TRL_RESULT).exists():  # a finished TRL run is kept, as a flow's run is
        return dict(json.loads((workdir / TRL_RESULT).read_text()))
    workdir.mkdir(exist_ok=True)
    started = time.perf_counter()
    budget_s = None if budget_minutes is None else budget_minutes * 60
    python = ensure_trl_venv()
    trained = start_trl(python, settings, workdir, "plain", save_model=True, budget_s=budget_s)()
    seconds = time.perf_counter() - started
    clock = [trained["began"], *trained["ends"]]
    end_eval = f"trl-s{run['seed']}-eval"
    end = evaluate(trained["model_dir"], eval_overrides, end_eval, root)
    side = {
        "end_eval": end_eval,
        "end": end,
        "minutes": seconds / 60,
        "step_seconds": median([end - begin for begin, end in itertools.pairwise(clock)]),
        "budget_minutes": budget_minutes,
        "rewards": trained["rewards"],
    }
    (workdir / TRL_RESULT).write_text(json.dumps(side, indent=1))
    return side


def kept_results(root: Path) -> dict[str, Any]:
    """``results.json`` of a ``--keep`` folder with every TRL result kept beside it."""
    results: dict[str, Any] = json.loads((root / RESULTS_FILE).read_text())
    for path in sorted(root.glob(f"trl_s*/{TRL_RESULT}")):
        results["trl"].setdefault(
            path.parent.name.removeprefix("trl_s"), json.loads(path.read_text())
        )
    return results


def seed_table(results: dict[str, Any]) -> str:
    """Start, end and gain of held-out greedy accuracy per seed and side, and the mean gain."""
    runs, trl = results["runs"], results["trl"]
    lines = [
        f"SmolLM2-135M-Instruct itself (no SFT): {results['base']:.3f}",
        f"{'side':<8}{'seed':>5}{'sft':>5}{'start':>8}{'end':>8}{'gain':>8}{'steps':>6}"
        f"{'s/step':>8}{'wall min':>10}",
    ]
    for run in runs:
        start, end = run["start"], run["end"]
        lines.append(
            f"{'ours':<8}{run['seed']:>5}{run.get('sft_seed', run['seed']):>5}{start:>8.3f}"
            f"{end:>8.3f}{end - start:>+8.3f}"
            f"{len(run['rewards']):>6}{run['step_seconds']:>8.0f}{run['minutes']:>10.1f}"
        )
    gains = [run["end"] - run["start"] for run in runs]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    lines.append(
        f"ours: mean gain over {len(gains)} seeds {statistics.mean(gains):+.3f} +- {spread:.3f}"
    )
    for run in runs:
        side = trl.get(str(run["seed"]))
        if side:
            start, end = run["start"], side["end"]
            lines.append(
                f"{'TRL':<8}{run['seed']:>5}{run.get('sft_seed', run['seed']):>5}{start:>8.3f}"
                f"{end:>8.3f}{end - start:>+8.3f}"
                f"{len(side['rewards']):>6}{side.get('step_seconds', float('nan')):>8.0f}"
                f"{side['minutes']:>10.1f}"
            )
    return "\n".join(lines)


def reward_table(results: dict[str, Any]) -> str:
    """Mean training reward per step of each seed that TRL ran too, ours beside TRL's (same
    start, same prompts in the same order); empty when TRL ran for none."""
    lines = []
    for run in results["runs"]:
        side = results["trl"].get(str(run["seed"]))
        if side:
            lines.append(f"seed {run['seed']} training reward per step (ours / TRL):")
            for step, ours in enumerate(run["rewards"], 1):
                theirs = side["rewards"][step - 1] if step <= len(side["rewards"]) else None
                cell = "-" if theirs is None else f"{theirs:.3f}"
                lines.append(f"{step:>6}{ours:>8.3f}{cell:>8}")
    return "\n".join(lines)


def audit_table(results: dict[str, Any], root: Path) -> str:
    """Per seed: what the GRPO rollouts of the first and last steps and the evals' greedy
    answers are made of (shares of samples), read from the runs kept under ``root``."""
    columns = (*KINDS, "last num right")
    lines = [
        f"{'seed':>4} {'samples':<24}{'reward':>7}"
        + "".join(f"{name:>15}" for name in columns)
        + f"{'tokens':>8}"
    ]

    def row(seed: str, name: str, audit: dict[str, float]) -> str:
        shares = "".join(f"{audit[column]:>15.3f}" for column in columns)
        return f"{seed:>4} {name:<24}{audit['reward']:>7.3f}{shares}{audit['tokens']:>8.1f}"

    lines.append(row("-", "held-out, SmolLM2 itself", eval_audit(root, BASE_EVAL)))
    for run in results["runs"]:
        seed = str(run["seed"])
        for window, audit in rollout_audit(root, run["grpo_run"]).items():
            lines.append(row(seed, f"rollouts, {window}", audit))
        lines.append(row(seed, "held-out, SFT (start)", eval_audit(root, run["start_eval"])))
        lines.append(row(seed, "held-out, GRPO (end)", eval_audit(root, run["end_eval"])))
        if seed in results["trl"]:
            audit = eval_audit(root, results["trl"][seed]["end_eval"])
            lines.append(row(seed, "held-out, TRL (end)", audit))
    return "\n".join(lines)


def keep_results(root: Path, results: dict[str, Any]) -> None:
    """Everything measured so far, as JSON beside the runs (``--summarize`` reads it)."""
    (root / RESULTS_FILE).write_text(json.dumps(results, indent=1))


def report(root: Path, results: dict[str, Any]) -> str:
    tables = [seed_table(results), flip_table(results, root), audit_table(results, root)]
    tables += [table for table in [reward_table(results)] if table]
    return "\n\n".join(tables) + "\n" + (f"load averages (1 min): {', '.join(results['loads'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--trl", nargs="*", type=int, default=[], help="seeds TRL runs too")
    parser.add_argument(
        "--trl-only", action="store_true", help="only TRL, for --trl seeds kept in --keep DIR"
    )
    parser.add_argument(
        "--sft-seed",
        type=int,
        help="one warm start for every seed: the SFT of this seed's chain (default: each its own)",
    )
    parser.add_argument(
        "--trl-minutes",
        type=float,
        help="TRL's training budget: it stops after the step that passes it (default: none)",
    )
    parser.add_argument("--validation", action="store_true", help="score the validation split")
    parser.add_argument("--keep", type=Path, help="keep the runs here (default: a temp dir)")
    parser.add_argument(
        "--smoke", action="store_true", help="one seed, 1+2 small steps, 4 problems"
    )
    parser.add_argument(
        "--summarize", type=Path, help="a --keep folder: print its tables again, run nothing"
    )
    args = parser.parse_args()
    if args.summarize:
        print(report(args.summarize, kept_results(args.summarize)))
        return
    if args.smoke:
        args.seeds = args.seeds[:1]
    eval_overrides = (VALIDATION if args.validation else []) + (SMOKE["eval"] if args.smoke else [])
    print(machine_line(), flush=True)
    if args.trl_only:
        if args.keep is None:
            parser.error(
                "--trl-only needs --keep DIR: the folder whose seeds' runs TRL starts from"
            )
        root = args.keep.resolve()
        kept = kept_results(root)
        for run in kept["runs"]:
            if run["seed"] in args.trl:
                side = run_trl(run, eval_overrides, args.smoke, root, args.trl_minutes)
                print(f"TRL seed {run['seed']}: {side['end']:.3f} ({side['minutes']:.1f} min)")
        return

    def load() -> str:
        return f"{time.strftime('%H:%M')} {os.getloadavg()[0]:.1f}"

    with tempfile.TemporaryDirectory() as tmp:
        root = (args.keep or Path(tmp)).resolve()
        base = evaluate("smollm2-135m-instruct", eval_overrides, BASE_EVAL, root)
        results: dict[str, Any] = {"base": base, "runs": [], "trl": {}, "loads": []}
        if (root / RESULTS_FILE).exists():  # a kept folder run again: keep its other seeds
            results = kept_results(root)
            results["runs"] = [run for run in results["runs"] if run["seed"] not in args.seeds]
        results["loads"].append(load())
        for seed in args.seeds:
            results["runs"].append(run_seed(seed, args.sft_seed, eval_overrides, args.smoke, root))
            results["loads"].append(load())
            keep_results(root, results)
            print(seed_table(results), flush=True)
        for run in results["runs"]:
            if run["seed"] in args.trl:
                side = run_trl(run, eval_overrides, args.smoke, root, args.trl_minutes)
                results["trl"][str(run["seed"])] = side
                results["loads"].append(load())
                keep_results(root, results)
        text = report(root, results)
    print(text)
    split = "validation split (training-side pairs, seed 777)" if args.validation else "held-out"
    record(
        f"SmolLM2-135M learns two-digit addition: {split} greedy accuracy before and after GRPO"
        " (issue 31)",
        text,
        f"Command: `{command_line()}`. 'start' is the SFT checkpoint's greedy accuracy, 'end' "
        "GRPO's (or TRL's, from the same checkpoint and prompts), both by the eval flow with "
        "DAPO's check; 'wall min' is the chain (SFT, GRPO, eval) plus the start's eval.",
        args.smoke or args.validation,
    )


if __name__ == "__main__":
    main()

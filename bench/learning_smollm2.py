"""A real pretrained model learns real math (issue 31): SmolLM2-135M-Instruct's held-out greedy
accuracy on two-digit additions before and after GRPO, with a reward the question cannot earn.

The task asks "What is 51 + 29? End your response with the line "Answer: <number>"." and NeMo
RL's DAPO check (``math_verify_impl: dapo_math_verify``) scores the last ``Answer:`` line
against the sum as a string, so a restated question ("Answer: 51 + 29") scores 0, where
math-verify scored ``\\boxed{51 + 29}`` 1 (the gamed run of issue 19). SmolLM2 answers
"51 + 29 = 80" and never writes the line, so the chain's SFT link teaches the format first
(``sft_smollm2_answer_line.yaml``, training pairs only).

Per seed (``sft.seed`` and ``grpo.seed``): the SFT -> GRPO -> eval chain (``flows.chain``),
then the eval flow on SFT's checkpoint. 'start' is SFT's held-out greedy accuracy, 'end'
GRPO's, both from the eval flow on the same 256 held-out additions (pairs no SFT or GRPO run
draws); the gain counted is GRPO's over its start. Each GRPO run's stored rollouts
(``rollouts/iter_*.parquet``) and both evals' samples are then audited: what the rewarded
answers are made of (correct bare numbers, numbers after a worked sum, wrong numbers,
restated expressions, no answer line).

``--trl SEED``: TRL's GRPOTrainer (``bench/vs_trl.py``'s worker, in its venv) from that seed's
SFT checkpoint, on the prompts our GRPO run drew, in order, with the same DAPO reward and
update settings; its final weights are scored by the same eval flow.
``--validation``: score training-side pairs of another seed instead of the held-out ones
(the split the recipe's settings were chosen on; the held-out pairs chose nothing).

Run:   nice -n 5 .venv/bin/python bench/learning_smollm2.py --seeds 1 2 3 --trl 1
Smoke: .venv/bin/python bench/learning_smollm2.py --smoke    (2+2 steps, 16 problems)
"""

import argparse
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
SMOKE = {
    "sft": ["sft.max_num_steps=2", "data.train.num_samples=32"],
    "grpo": ["grpo.max_num_steps=2", "policy.generation.backend=hf"],
    "eval": ["data.num_samples=16"],
}
AUDIT_WINDOW = 5  # GRPO steps compared at the start and at the end of a run
KINDS = (
    "correct number",
    "correct after a worked sum",
    "wrong number",
    "restated expression",
    "other answer",
    "no Answer line",
)


def answer_kind(response: str, ground_truth: str) -> str:
    """What a response's last ``Answer:`` line holds, read as DAPO's check reads it."""
    from nemo_rl_core.environments.dapo_math_verifier import (
        ANSWER_PATTERN,
        SCORED_TAIL,
        normalize_final_answer,
    )

    lines = re.findall(ANSWER_PATTERN, response[-SCORED_TAIL:])
    if not lines:
        return "no Answer line"
    written = lines[-1].strip()
    bare = re.fullmatch(r"\d+\.?", written) is not None
    if normalize_final_answer(written) == normalize_final_answer(ground_truth):
        return "correct number" if bare else "correct after a worked sum"
    if bare:
        return "wrong number"
    return "restated expression" if re.search(r"\d\s*[-+*/]\s*\d", written) else "other answer"


def audit_rows(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Shares of each answer kind, the mean reward and the mean response tokens of ``rows``
    (rollout-table rows: response, ground_truth, reward, response_tokens)."""
    kinds = Counter(answer_kind(r["response"], r["ground_truth"]) for r in rows)
    shares = {kind: kinds[kind] / len(rows) for kind in KINDS}
    return {
        "reward": statistics.mean(r["reward"] for r in rows),
        **shares,
        "tokens": statistics.mean(r["response_tokens"] for r in rows),
    }


def rollout_audit(rollouts: Path) -> dict[str, dict[str, float]]:
    """``audit_rows`` of the first and the last ``AUDIT_WINDOW`` GRPO steps' rollouts."""
    import pyarrow.parquet as pq

    steps = [pq.read_table(path).to_pylist() for path in sorted(rollouts.glob("iter_*.parquet"))]
    window = min(AUDIT_WINDOW, max(1, len(steps) // 2))
    first = [row for step in steps[:window] for row in step]
    last = [row for step in steps[-window:] for row in step]
    return {f"steps 1-{window}": audit_rows(first), f"last {window}": audit_rows(last)}


def evaluate(model: str, overrides: list[str], run_id: str, root: Path) -> dict[str, Any]:
    """The eval flow on ``model``: greedy accuracy and the audit of its samples."""
    import pyarrow.parquet as pq

    from flows.eval import evaluate as eval_flow

    result = eval_flow(
        config_path=CONFIGS["eval"],
        overrides=[*overrides, f"generation.model_name={model}", f"eval.save_path={root}/evals"],
        run_id=run_id,
        storage_root=f"file://{root}/store",
    )
    rows = pq.read_table(result["results"]).to_pylist()
    return {"accuracy": result["scores"]["pass@1"], "audit": audit_rows(rows)}


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


def run_seed(seed: int, eval_overrides: list[str], smoke: bool, root: Path) -> dict[str, Any]:
    """The chain of one seed, then the eval of its SFT checkpoint; accuracies, audits, times."""
    import pyarrow.parquet as pq

    from flows.chain import sft_grpo_eval
    from nemo_rl_core.storage.run_storage import RunStorage

    chain_id = f"smollm2-answer-s{seed}"
    started = time.perf_counter()
    summary = sft_grpo_eval(
        sft_config=CONFIGS["sft"],
        grpo_config=CONFIGS["grpo"],
        eval_config=CONFIGS["eval"],
        overrides=link_overrides(seed, eval_overrides, smoke, root),
        chain_id=chain_id,
        storage_root=f"file://{root}/store",
    )
    chain_seconds = time.perf_counter() - started
    started = time.perf_counter()
    start = evaluate(summary["sft"]["checkpoint"], eval_overrides, f"{chain_id}-eval-start", root)
    start_seconds = time.perf_counter() - started
    grpo_run = summary["grpo"]["run_id"]
    end_samples = root / "evals" / summary["eval"]["run_id"] / "evaluation_data.parquet"
    storage = RunStorage(f"file://{root}/store", grpo_run)
    iterations = len(list((root / "store" / "runs" / grpo_run).glob("iter_*")))
    manifests = [storage.read_manifest(i)["stages"] for i in range(iterations)]
    return {
        "seed": seed,
        "sft_checkpoint": summary["sft"]["checkpoint"],
        "grpo_run": grpo_run,
        "start": start,
        "end": {
            "accuracy": summary["eval"]["scores"]["pass@1"],
            "audit": audit_rows(pq.read_table(end_samples).to_pylist()),
        },
        "minutes": (chain_seconds + start_seconds) / 60,
        "step_seconds": median([t["total"] for t in flow_iteration_times(manifests)]),
        "rewards": flow_curves(manifests)["reward"],
        "rollouts": rollout_audit(root / "logs" / grpo_run / "rollouts"),
    }


def run_trl(run: dict[str, Any], eval_overrides: list[str], smoke: bool, root: Path) -> dict:
    """TRL's GRPOTrainer from ``run``'s SFT checkpoint on the prompts its GRPO run drew (the
    same seed's batches, in order), then the eval flow on TRL's final weights."""
    from vs_trl import ensure_trl_venv, settings_from_config, start_trl

    checkpoint = run["sft_checkpoint"]
    overrides = [f"grpo.seed={run['seed']}", f"policy.model_name={checkpoint}"]
    settings = settings_from_config(
        CONFIGS["grpo"], overrides + (SMOKE["grpo"] if smoke else []), checkpoint
    )
    workdir = root / f"trl_s{run['seed']}"
    workdir.mkdir(exist_ok=True)
    started = time.perf_counter()
    trained = start_trl(ensure_trl_venv(), settings, workdir, "plain", save_model=True)()
    seconds = time.perf_counter() - started
    end = evaluate(trained["model_dir"], eval_overrides, f"trl-s{run['seed']}-eval", root)
    return {"end": end, "minutes": seconds / 60, "rewards": trained["rewards"]}


def seed_table(runs: list[dict[str, Any]], trl: dict[int, dict]) -> str:
    lines = [
        f"{'side':<8}{'seed':>5}{'start':>8}{'end':>8}{'gain':>8}{'steps':>6}"
        f"{'s/step':>8}{'wall min':>10}"
    ]
    for run in runs:
        start, end = run["start"]["accuracy"], run["end"]["accuracy"]
        lines.append(
            f"{'ours':<8}{run['seed']:>5}{start:>8.3f}{end:>8.3f}{end - start:>+8.3f}"
            f"{len(run['rewards']):>6}{run['step_seconds']:>8.0f}{run['minutes']:>10.1f}"
        )
    gains = [run["end"]["accuracy"] - run["start"]["accuracy"] for run in runs]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    lines.append(
        f"ours: mean gain over {len(gains)} seeds {statistics.mean(gains):+.3f} +- {spread:.3f}"
    )
    for run in runs:
        if run["seed"] in trl:
            start, end = run["start"]["accuracy"], trl[run["seed"]]["end"]["accuracy"]
            steps, minutes = len(trl[run["seed"]]["rewards"]), trl[run["seed"]]["minutes"]
            lines.append(
                f"{'TRL':<8}{run['seed']:>5}{start:>8.3f}{end:>8.3f}{end - start:>+8.3f}"
                f"{steps:>6}{'':>8}{minutes:>10.1f}"
            )
    return "\n".join(lines)


def audit_table(runs: list[dict[str, Any]], trl: dict[int, dict]) -> str:
    """Per seed: the GRPO rollouts of the first and last steps and both evals' answers."""
    header = f"{'seed':>4} {'samples':<22}{'reward':>7}" + "".join(
        f"{kind[:13]:>15}" for kind in KINDS
    )
    lines = [header + f"{'tokens':>8}"]

    def row(seed: int, name: str, audit: dict[str, float]) -> str:
        shares = "".join(f"{audit[kind]:>15.3f}" for kind in KINDS)
        return f"{seed:>4} {name:<22}{audit['reward']:>7.3f}{shares}{audit['tokens']:>8.1f}"

    for run in runs:
        for window, audit in run["rollouts"].items():
            lines.append(row(run["seed"], f"rollouts, {window}", audit))
        lines.append(row(run["seed"], "held-out, SFT (start)", run["start"]["audit"]))
        lines.append(row(run["seed"], "held-out, GRPO (end)", run["end"]["audit"]))
        if run["seed"] in trl:
            lines.append(row(run["seed"], "held-out, TRL (end)", trl[run["seed"]]["end"]["audit"]))
    return "\n".join(lines)


def keep_results(root: Path, base: dict, runs: list[dict], trl: dict[int, dict]) -> None:
    """Everything measured so far, as JSON beside the runs (a run stopped later keeps it)."""
    results = {"base": base, "runs": runs, "trl": trl}
    (root / "results.json").write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--trl", nargs="*", type=int, default=[], help="seeds TRL runs too")
    parser.add_argument("--validation", action="store_true", help="score the validation split")
    parser.add_argument("--keep", type=Path, help="keep the runs here (default: a temp dir)")
    parser.add_argument("--smoke", action="store_true", help="one seed, 2+2 steps, 16 problems")
    args = parser.parse_args()
    if args.smoke:
        args.seeds = args.seeds[:1]
    eval_overrides = (VALIDATION if args.validation else []) + (SMOKE["eval"] if args.smoke else [])
    print(machine_line(), flush=True)
    loads = [f"{time.strftime('%H:%M')} load {os.getloadavg()[0]:.1f}"]
    with tempfile.TemporaryDirectory() as tmp:
        root = (args.keep or Path(tmp)).resolve()
        base = evaluate("smollm2-135m-instruct", eval_overrides, "base-eval", root)
        print(f"SmolLM2-135M-Instruct itself: {base['accuracy']:.3f}", flush=True)
        runs, trl = [], {}
        for seed in args.seeds:
            runs.append(run_seed(seed, eval_overrides, args.smoke, root))
            loads.append(f"{time.strftime('%H:%M')} load {os.getloadavg()[0]:.1f}")
            print(seed_table(runs, trl), flush=True)
            keep_results(root, base, runs, trl)
        for run in runs:
            if run["seed"] in args.trl:
                trl[run["seed"]] = run_trl(run, eval_overrides, args.smoke, root)
                loads.append(f"{time.strftime('%H:%M')} load {os.getloadavg()[0]:.1f}")
                keep_results(root, base, runs, trl)
        table = f"SmolLM2-135M-Instruct itself (no SFT): {base['accuracy']:.3f}\n" + seed_table(
            runs, trl
        )
        audit = audit_table(runs, trl)
    split = "validation split (training-side pairs, seed 777)" if args.validation else "held-out"
    print(f"{table}\n\n{audit}\nload averages (1 min): {', '.join(loads)}")
    record(
        f"SmolLM2-135M learns two-digit addition: {split} greedy accuracy before and after GRPO"
        " (issue 31)",
        f"{table}\n\n{audit}\nload averages (1 min): {', '.join(loads)}",
        f"Command: `{command_line()}`. 'start' is the SFT checkpoint's greedy accuracy, 'end' "
        "GRPO's (or TRL's, from the same checkpoint and prompts), both by the eval flow with "
        "DAPO's check; 'wall min' is the chain (SFT, GRPO, eval) plus the start's eval.",
        args.smoke or args.validation,
    )


if __name__ == "__main__":
    main()

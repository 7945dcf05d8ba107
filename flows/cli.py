"""``python -m flows <algorithm> --config FILE key=value ...`` (or ``python -m
flows.<algorithm>``): check the config, then run the algorithm's flow without a server
(Prefect's ephemeral API), with NeMo RL-style overrides. Any algorithm that
``nemo_rl_core/pipeline/algorithms.py`` declares has this command; none needs code here.

A mistake in the config, its model or its data is reported in one line before Prefect or
any backend starts and before anything is written (``flows.config_check``, which loads
neither torch nor Prefect: seconds, not the minute the stack takes to load); so is an
error of the run itself (the flow run's log above it holds the details; ``--traceback``
prints Python's traceback).
"""

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

from nemo_rl_core.pipeline.algorithm_configs import ALGORITHM_CONFIGS, algorithm_config
from nemo_rl_core.utils.config import ConfigError

if TYPE_CHECKING:
    from prefect import Flow


def main(argv: list[str] | None = None) -> None:
    """``python -m flows <algorithm> [options] [overrides]``: the algorithm by its declared
    name, then the options every flow takes (``--help`` after the name lists them)."""
    argv = sys.argv[1:] if argv is None else argv
    known = sorted(ALGORITHM_CONFIGS)
    if not argv or argv[0] not in ALGORITHM_CONFIGS:
        given = f"{argv[0]!r} is not one; " if argv and not argv[0].startswith("-") else ""
        print(
            f"usage: python -m flows <algorithm> --config FILE [key=value ...]\n"
            f"error: name the algorithm first ({given}known: {', '.join(known)})",
            file=sys.stderr,
        )
        raise SystemExit(2)
    algorithm, options = argv[0], argv[1:]
    if algorithm in _OWN_COMMANDS:
        _OWN_COMMANDS[algorithm](options)
    else:
        run_cli(algorithm, options)


def flow_or_command(algorithm: str, module_name: str) -> "Flow[..., dict]":
    """What ``flows/<algorithm>.py`` is: imported (Prefect's entrypoint
    ``flows/<algorithm>.py:<algorithm>``), the algorithm's training flow; run as
    ``python -m flows.<algorithm>``, ``python -m flows <algorithm>`` (it exits)."""
    if module_name == "__main__":
        main([algorithm, *sys.argv[1:]])
        raise SystemExit(0)
    return training_flow_of(algorithm)


@cache
def training_flow_of(algorithm: str) -> "Flow[..., dict]":
    """The Prefect flow of the declared training algorithm ``algorithm`` (one per process)."""
    from flows.loop import training_flow
    from nemo_rl_core.pipeline.registry import pipeline_named

    return training_flow(pipeline_named(algorithm))


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options every flow's command line takes."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", required=True, help="NeMo RL-style YAML config")
    parser.add_argument("--run-id", default=None, help="continue this run (default: a new one)")
    parser.add_argument("--storage-root", default=None, help="where the run is stored")
    parser.add_argument(
        "--traceback", action="store_true", help="print Python's traceback of an error"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM's, Prefect's and the stages' own start-up and state logs",
    )
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides")
    return parser


def _check_run_id(run_id: str | None) -> None:
    from nemo_rl_core.storage.names import validate_name

    if run_id is not None:
        try:
            validate_name("--run-id", run_id)
        except ValueError as err:
            raise ConfigError(str(err)) from None


def run_cli(algorithm: str, argv: list[str]) -> None:
    """The command line of the declared training algorithm ``algorithm``: its config is
    checked as its config class and data setup say (``ALGORITHM_CONFIGS``, no torch),
    then its training flow runs."""
    parser = _parser(f"python -m flows {algorithm}", f"Train {algorithm.upper()}.")
    parser.add_argument(
        "--steps-per-run", type=int, default=None, help="iterations this call may run"
    )
    parser.add_argument(
        "--start-over",
        action="store_true",
        help="delete what is stored of --run-id and train it from iteration 0",
    )
    args = parser.parse_args(argv)
    declared = algorithm_config(algorithm)

    def check() -> None:
        from flows.config_check import check_run_config

        if declared.data_setup is None:
            raise ConfigError(f"{algorithm} declares no training data: it has no training flow")
        if args.run_id is not None:
            refuse_if_leased(args, declared.config_class)
        check_run_config(declared.config_class, args.config, args.overrides, declared.data_setup)

    def load_flow() -> Callable[..., dict]:
        return training_flow_of(algorithm)

    shown = ("run_id", "storage_root", "iterations")
    parameters = {"steps_per_run": args.steps_per_run, "start_over": args.start_over}
    _run(args, check, load_flow, shown, **parameters)


def refuse_if_leased(args: argparse.Namespace, config_class: type[Any]) -> None:
    """Before anything loads: a run that another live run drives (its lease) is refused in
    seconds, naming the holder and until when, instead of after its models are built."""
    from nemo_rl_core.algorithms.grpo_config import load_master_config
    from nemo_rl_core.storage.lease import held_error, live_lease

    root = args.storage_root
    if root is None:
        root = load_master_config(
            args.config, args.overrides, config_class
        ).checkpointing.checkpoint_dir
    record = live_lease(root, args.run_id)
    if record is None:
        return
    freeing = (
        f"once that flow run has ended, python -m flows.lease --break --run-id {args.run_id} "
        f"--storage-root {root} frees its lease at once"
        if record.get("flow_run_id")
        else None
    )
    raise held_error(args.run_id, f"{root}/runs/{args.run_id}", record, freeing)


def run_eval_cli(argv: list[str]) -> None:
    """The command line of the eval flow: check the config, score, print the scores."""
    args = _parser("python -m flows eval", "Score a checkpoint (pass@k, avg@n).").parse_args(argv)

    def check() -> None:
        from nemo_rl_core.evals.config_check import check_eval_config

        check_eval_config(args.config, args.overrides)

    def load_flow() -> Callable[..., dict]:
        from flows.evaluation import evaluate

        return evaluate

    _run(args, check, load_flow, ("run_id", "storage_root", "scores"))


# Algorithms whose flow is not the declaration's training flow: eval trains nothing, and
# its flow publishes the scores and samples (flows/evaluation.py).
_OWN_COMMANDS: dict[str, Callable[[list[str]], None]] = {"eval": run_eval_cli}


def _run(
    args: argparse.Namespace,
    check: Callable[[], None],
    load_flow: Callable[[], Callable[..., dict]],
    shown: tuple[str, ...],
    **parameters: Any,
) -> None:
    """Check the run id and the config before Prefect or any backend loads, then load the
    flow and run it; print ``shown`` of its summary, or the error in one line."""
    if not args.verbose:
        quiet_library_logs()
    try:
        _check_run_id(args.run_id)
        check()
        run_flow = load_flow()
        if not args.verbose:
            quiet_prefect_logs()
        summary = run_flow(
            config_path=args.config,
            overrides=args.overrides,
            run_id=args.run_id,
            storage_root=args.storage_root,
            **parameters,
        )
    except Exception as err:
        if args.traceback:
            raise
        fail(err)
    print(json.dumps({key: summary[key] for key in shown}))


def quiet_library_logs() -> None:
    """Before vLLM, torch and transformers load: only their errors, no progress bars."""
    for name, value in {
        "VLLM_LOGGING_LEVEL": "ERROR",
        "TORCH_CPP_LOG_LEVEL": "ERROR",
        "TQDM_DISABLE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
    }.items():
        os.environ.setdefault(name, value)
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def quiet_prefect_logs() -> None:
    """After Prefect and torch load: the terminal keeps the flow run's lines (one per iteration, the summary, warnings);
    task-state lines and the temporary server's notices stay in Prefect's own records."""
    logging.getLogger("prefect").setLevel(logging.WARNING)
    logging.getLogger("prefect.flow_runs").setLevel(logging.INFO)
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)  # "Triton not available"


def fail(err: Exception) -> None:
    """One line on stderr: what was wrong (a config mistake exits 2, a refused run 3, as one
    another run drives, anything else 1)."""
    from nemo_rl_core.storage.refusal import RunRefusedError

    what = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    if isinstance(err, ConfigError | FileNotFoundError):
        print(f"error: {what}", file=sys.stderr)
        raise SystemExit(2) from None
    if isinstance(err, RunRefusedError):
        print(f"error: {what}", file=sys.stderr)
        raise SystemExit(3) from None
    print(f"error: {type(err).__name__}: {what} (--traceback shows where)", file=sys.stderr)
    raise SystemExit(1) from None

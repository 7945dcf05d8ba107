"""``python -m flows.<algorithm> --config FILE key=value ...``: check the config, then run the
flow without a server (Prefect's ephemeral API), with NeMo RL-style overrides.

A mistake in the config, its model or its data is reported in one line before Prefect or
any backend starts and before anything is written (``flows.config_check``, which loads
neither torch nor Prefect: seconds, not the minute the stack takes to load); so is an
error of the run itself (the flow run's log above it holds the details; ``--traceback``
prints Python's traceback).
"""

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from nemo_rl_core.algorithms.grpo_config import data_setup
from nemo_rl_core.data.datasets.builder import DataSetup
from nemo_rl_core.utils.config import ConfigError


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


def run_cli(
    algorithm: str,
    config_class: type[BaseModel],
    setup_for: Callable[[Any], DataSetup] = data_setup,
) -> None:
    """The command line of the training flow ``flows.<algorithm>.<algorithm>``, whose
    pipeline validates its config into ``config_class`` and sets its data up as
    ``setup_for`` (its declaration's ``data_setup``) says."""
    parser = _parser(f"python -m flows.{algorithm}", f"Train {algorithm.upper()}.")
    parser.add_argument(
        "--steps-per-run", type=int, default=None, help="iterations this call may run"
    )
    args = parser.parse_args()

    def check() -> None:
        from flows.config_check import check_run_config

        check_run_config(config_class, args.config, args.overrides, setup_for)

    flow_name = f"flows.{algorithm}:{algorithm}"
    shown = ("run_id", "storage_root", "iterations")
    _run(args, check, flow_name, shown, steps_per_run=args.steps_per_run)


def run_eval_cli() -> None:
    """The command line of the eval flow: check the config, score, print the scores."""
    args = _parser("python -m flows.eval", "Score a checkpoint (pass@k, avg@n).").parse_args()

    def check() -> None:
        from nemo_rl_core.evals.eval import check_eval_config

        check_eval_config(args.config, args.overrides)

    _run(args, check, "flows.eval:evaluate", ("run_id", "storage_root", "scores"))


def _run(
    args: argparse.Namespace,
    check: Callable[[], None],
    flow_name: str,
    shown: tuple[str, ...],
    **parameters: Any,
) -> None:
    """Check the run id and the config before Prefect or any backend loads, then run the
    flow ``module:function``; print ``shown`` of its summary, or the error in one line."""
    if not args.verbose:
        quiet_library_logs()
    try:
        _check_run_id(args.run_id)
        check()
        module, _, function = flow_name.partition(":")
        run_flow = getattr(importlib.import_module(module), function)
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
    """One line on stderr: what was wrong (a config mistake exits 2, anything else 1)."""
    what = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    if isinstance(err, ConfigError | FileNotFoundError):
        print(f"error: {what}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"error: {type(err).__name__}: {what} (--traceback shows where)", file=sys.stderr)
    raise SystemExit(1) from None

"""``python -m flows.<name> --config FILE key=value ...``: run a flow without a server
(Prefect's ephemeral API), with NeMo RL-style overrides."""

import argparse
import json
import sys
from collections.abc import Callable

from nemo_rl_core.pipeline.spec import Pipeline
from nemo_rl_core.utils.config import ConfigError


def run_flow_from_cli(flow_fn: Callable[..., dict], pipeline: Pipeline) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m flows.{pipeline.name}", description=flow_fn.__doc__
    )
    parser.add_argument("--config", required=True, help="NeMo RL-style YAML config")
    parser.add_argument("--run-id", default=None, help="continue this run (default: a new one)")
    parser.add_argument(
        "--storage-root", default=None, help="default: checkpointing.checkpoint_dir"
    )
    parser.add_argument(
        "--steps-per-run", type=int, default=None, help="iterations this call may run"
    )
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides")
    args = parser.parse_args()
    try:
        summary = flow_fn(
            config_path=args.config,
            overrides=args.overrides,
            run_id=args.run_id,
            storage_root=args.storage_root,
            steps_per_run=args.steps_per_run,
        )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps({k: summary[k] for k in ("run_id", "storage_root", "iterations")}))

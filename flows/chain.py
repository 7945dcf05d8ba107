"""The chain a user runs as one deployment: SFT, then GRPO starting from SFT's last
checkpoint, then eval of GRPO's last checkpoint. Each link is its algorithm's own flow (a
subflow run, with its own lease, manifest and checkpoints); the chain only hands the
checkpoint on.

    SFT -> (final checkpoint) -> GRPO -> (final checkpoint) -> eval

    python -m flows.chain --sft examples/configs/sft_tiny.yaml \\
        --grpo examples/configs/grpo_addition_tiny.yaml \\
        --eval examples/configs/eval_addition_tiny.yaml  [sft:sft.max_num_steps=8 ...]

The links' runs are ``<chain_id>-sft``, ``<chain_id>-grpo`` and ``<chain_id>-eval`` under
one storage root, so running the same chain_id again continues where it stopped: a finished
link has nothing to do, a stopped one resumes from its last commit.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nemo_rl_core.utils.config import ConfigError

LINKS = ("sft", "grpo", "eval")
HANDOFF = {"grpo": "policy.model_name", "eval": "generation.model_name"}
DEFAULT_CONFIGS = {
    "sft": "examples/configs/sft_chain_tiny.yaml",
    "grpo": "examples/configs/grpo_addition_tiny.yaml",
    "eval": "examples/configs/eval_addition_tiny.yaml",
}
DEFAULT_ROOT = "results/chain"


def link_overrides(overrides: list[str] | None) -> dict[str, list[str]]:
    """``link:key=value`` overrides split by link (``sft:sft.max_num_steps=8``)."""
    split: dict[str, list[str]] = {link: [] for link in LINKS}
    for item in overrides or []:
        link, sep, override = item.partition(":")
        if not sep or link not in split or "=" not in override:
            raise ConfigError(
                f"chain override {item!r}: write <link>:<key>=<value> with link one of "
                f"{', '.join(LINKS)} (e.g. sft:sft.max_num_steps=8)"
            )
        split[link].append(override)
    return split


def check_chain(configs: dict[str, str], overrides: dict[str, list[str]]) -> None:
    """Every link's config, checked before any link runs (torch-free, writes nothing). The
    model a later link starts from does not exist yet: its key is checked with the model
    SFT starts from, which the handed-on checkpoint replaces."""
    from flows.config_check import check_run_config
    from nemo_rl_core.algorithms.grpo_config import MasterConfig
    from nemo_rl_core.algorithms.sft_config import SFTMasterConfig, data_setup
    from nemo_rl_core.evals.config_check import check_eval_config

    sft = check_run_config(SFTMasterConfig, configs["sft"], overrides["sft"], data_setup)
    stand_in = sft.policy.model_name
    check_run_config(
        MasterConfig, configs["grpo"], [*overrides["grpo"], f"{HANDOFF['grpo']}={stand_in}"]
    )
    check_eval_config(configs["eval"], [*overrides["eval"], f"{HANDOFF['eval']}={stand_in}"])


def link_run_id(chain_id: str, link: str) -> str:
    return f"{chain_id}-{link}"


def final_checkpoint(storage_root: str, run_id: str, chain_id: str, link: str) -> str:
    """A local folder holding the link's last committed checkpoint: the stored one on local
    disk, else a copy in the model cache named after the chain, so that a continued chain
    hands on the same path (the next link's identity keys hold it). The copy is checked
    against the checkpoint's recorded digests: one a killed chain left half made is made
    again."""
    from nemo_rl_core.models.local_models import default_model_cache
    from nemo_rl_core.storage.handles import RunRef, open_storage
    from nemo_rl_core.utils.checkpoint import read_training_info
    from nemo_rl_core.utils.checkpoint_copy import checkpoint_copy

    storage = open_storage(RunRef(storage_root, run_id))
    step = storage.latest_checkpoint()
    if step is None:
        raise RuntimeError(f"chain {chain_id}: link {link} ({run_id}) committed no checkpoint")
    if storage.on_local_disk:
        return str(storage.fetch_checkpoint(step))
    copy = default_model_cache() / "chains" / chain_id / f"{link}-step_{step}"
    return str(checkpoint_copy(storage, step, read_training_info(storage, step), copy))


if __name__ != "__main__":
    from prefect import flow

    from flows.evaluation import evaluate
    from flows.grpo import grpo
    from flows.run_setup import load_storage_block, new_run_id
    from flows.sft import sft

    @flow(name="chain", log_prints=True)
    def sft_grpo_eval(
        sft_config: str = DEFAULT_CONFIGS["sft"],
        grpo_config: str = DEFAULT_CONFIGS["grpo"],
        eval_config: str = DEFAULT_CONFIGS["eval"],
        overrides: list[str] | None = None,
        chain_id: str | None = None,
        storage_root: str | None = None,
        storage_block: str | None = None,
    ) -> dict:
        """SFT, then GRPO from SFT's last checkpoint, then eval of GRPO's last checkpoint.

        ``overrides`` are ``<link>:<key>=<value>``; ``chain_id`` continues that chain (a new
        id otherwise); every link's run is stored under ``storage_root`` (default
        ``results/chain``); ``storage_block``
        names a prefect-aws ``AwsCredentials`` block for an ``s3://`` root."""
        configs = {"sft": sft_config, "grpo": grpo_config, "eval": eval_config}
        per_link = link_overrides(overrides)
        check_chain(configs, per_link)
        storage_root = storage_root or DEFAULT_ROOT
        load_storage_block(storage_root, storage_block)
        chain_id = chain_id or new_run_id("chain")
        common = {"storage_root": storage_root, "storage_block": storage_block}
        summary: dict = {"chain_id": chain_id, "storage_root": storage_root}
        model = None
        for link, run_link in (("sft", sft), ("grpo", grpo), ("eval", evaluate)):
            run_id = link_run_id(chain_id, link)
            link_args = per_link[link] + ([f"{HANDOFF[link]}={model}"] if model else [])
            result: Any = run_link(
                config_path=configs[link], overrides=link_args, run_id=run_id, **common
            )
            summary[link] = {"run_id": run_id, "started_from": model}
            if link == "eval":
                summary[link]["scores"] = result["scores"]
            else:
                model = final_checkpoint(storage_root, run_id, chain_id, link)
                summary[link]["checkpoint"] = model
        print(f"chain {chain_id}: eval of {model}: {json.dumps(summary['eval']['scores'])}")
        return summary


def main() -> None:
    """``python -m flows.chain``: check every link's config, then run the chain."""
    from flows.cli import fail, quiet_library_logs, quiet_prefect_logs

    parser = argparse.ArgumentParser(
        prog="python -m flows.chain", description="SFT, then GRPO from it, then eval."
    )
    for link in LINKS:
        parser.add_argument(f"--{link}", default=DEFAULT_CONFIGS[link], help=f"{link} config")
    parser.add_argument("--chain-id", default=None, help="continue this chain")
    parser.add_argument("--storage-root", default=DEFAULT_ROOT)
    parser.add_argument("--traceback", action="store_true")
    parser.add_argument("overrides", nargs="*", help="<link>:<key>=<value> overrides")
    args = parser.parse_args()
    quiet_library_logs()
    configs = {link: getattr(args, link) for link in LINKS}
    try:
        for link, path in configs.items():
            if not Path(path).is_file():
                raise ConfigError(f"--{link}: config file {path} does not exist")
        check_chain(configs, link_overrides(args.overrides))
        from flows.chain import sft_grpo_eval

        quiet_prefect_logs()
        summary = sft_grpo_eval(
            sft_config=configs["sft"],
            grpo_config=configs["grpo"],
            eval_config=configs["eval"],
            overrides=args.overrides,
            chain_id=args.chain_id,
            storage_root=args.storage_root,
        )
    except Exception as err:
        if args.traceback:
            raise
        fail(err)
    json.dump(summary, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()

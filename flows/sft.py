"""The SFT flow: each iteration is one step of NeMo RL's ``sft_train``, one Prefect task run
per stage, as ``nemo_rl_core.pipeline.algorithms.SFT`` declares it.

    [validate (val_loss)] -> batch -> train (NLL) -> checkpoint

Run locally without a server:
    python -m flows sft --config examples/configs/sft_tiny.yaml sft.max_num_steps=3
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

from flows.cli import flow_or_command

sft = flow_or_command("sft", __name__)

"""The DPO flow: each iteration is one step of NeMo RL's ``dpo_train``, one Prefect task run
per stage, as ``nemo_rl_core.pipeline.algorithms.DPO`` declares it.

    [validate (loss, preference accuracy)] -> batch -> reference -> train (DPO) -> checkpoint

Run locally without a server:
    python -m flows dpo --config examples/configs/dpo_tiny.yaml dpo.max_num_steps=3
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

from flows.cli import flow_or_command

dpo = flow_or_command("dpo", __name__)

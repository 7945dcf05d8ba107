"""The DPO flow: each iteration is one step of NeMo RL's ``dpo_train``, one Prefect task run
per stage, as ``nemo_rl_core.pipeline.algorithms.DPO`` declares it.

    [validate (loss, preference accuracy)] -> batch -> reference -> train (DPO) -> checkpoint

Run locally without a server:
    python -m flows.dpo --config examples/configs/dpo_tiny.yaml dpo.max_num_steps=3
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

if __name__ == "__main__":  # the command line checks the config before loading the stack
    from flows.cli import run_cli
    from nemo_rl_core.algorithms.dpo_config import DPOMasterConfig, data_setup

    run_cli("dpo", DPOMasterConfig, data_setup)
else:
    from flows.loop import training_flow
    from nemo_rl_core.pipeline.algorithms import DPO

    dpo = training_flow(DPO)

"""The SFT flow: each iteration is one step of NeMo RL's ``sft_train``, one Prefect task run
per stage, as ``nemo_rl_core.pipeline.algorithms.SFT`` declares it.

    [validate (val_loss)] -> batch -> train (NLL) -> checkpoint

Run locally without a server:
    python -m flows.sft --config examples/configs/sft_tiny.yaml sft.max_num_steps=3
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

if __name__ == "__main__":  # the command line checks the config before loading the stack
    from flows.cli import run_cli
    from nemo_rl_core.algorithms.sft_config import SFTMasterConfig, data_setup

    run_cli("sft", SFTMasterConfig, data_setup)
else:
    from flows.loop import training_flow
    from nemo_rl_core.pipeline.algorithms import SFT

    sft = training_flow(SFT)

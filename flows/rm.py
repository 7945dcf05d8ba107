"""The reward-model flow: each iteration is one step of NeMo RL's ``rm_train``, one Prefect
task run per stage, as ``nemo_rl_core.pipeline.algorithms.RM`` declares it.

    [validate (loss, preference accuracy)] -> batch -> train (Bradley-Terry) -> checkpoint

Run locally without a server:
    python -m flows.rm --config examples/configs/rm_tiny.yaml rm.max_num_steps=3
Each committed checkpoint is an HF folder that AutoModelForSequenceClassification loads
and GRPO's reward_model environment scores with (env.reward_model.model_name).
"""

if __name__ == "__main__":  # the command line checks the config before loading the stack
    from flows.cli import run_cli
    from nemo_rl_core.algorithms.dpo_config import data_setup
    from nemo_rl_core.algorithms.rm_config import RMMasterConfig

    run_cli("rm", RMMasterConfig, data_setup)
else:
    from flows.loop import training_flow
    from nemo_rl_core.pipeline.algorithms import RM

    rm = training_flow(RM)

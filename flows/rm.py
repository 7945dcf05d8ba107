"""The reward-model flow: each iteration is one step of NeMo RL's ``rm_train``, one Prefect
task run per stage, as ``nemo_rl_core.pipeline.algorithms.RM`` declares it.

    [validate (loss, preference accuracy)] -> batch -> train (Bradley-Terry) -> checkpoint

Run locally without a server:
    python -m flows rm --config examples/configs/rm_tiny.yaml rm.max_num_steps=3
Each committed checkpoint is an HF folder that AutoModelForSequenceClassification loads
and GRPO's reward_model environment scores with (env.reward_model.model_name).
"""

from flows.cli import flow_or_command

rm = flow_or_command("rm", __name__)

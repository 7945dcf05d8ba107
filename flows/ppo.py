"""The PPO flow: GRPO's stages plus the value model, as ``nemo_rl_core.pipeline.algorithms.PPO``
declares it.

    prompts -> generate -> reward -> logprob -> value -> advantage (GAE) -> train -> checkpoint

``train`` updates the policy and the value model and commits both in one checkpoint
(the value model under ``value/``), from which the next iteration loads them.
Run locally without a server:
    python -m flows ppo --config examples/configs/ppo_tiny.yaml ppo.max_num_steps=3
"""

from flows.cli import flow_or_command

ppo = flow_or_command("ppo", __name__)

"""The PPO flow: GRPO's stages plus the value model, as ``nemo_rl_core.pipeline.algorithms.PPO``
declares it.

    prompts -> generate -> reward -> logprob -> value -> advantage (GAE) -> train -> checkpoint

``train`` updates the policy and the value model and commits both in one checkpoint
(the value model under ``value/``), from which the next iteration loads them.
Run locally without a server:
    python -m flows.ppo --config examples/configs/ppo_tiny.yaml ppo.max_num_steps=3
"""

if __name__ == "__main__":  # the command line checks the config before loading the stack
    from flows.cli import run_cli
    from nemo_rl_core.algorithms.ppo_config import PPOMasterConfig

    run_cli("ppo", PPOMasterConfig)
else:
    from flows.loop import training_flow
    from nemo_rl_core.pipeline.algorithms import PPO

    ppo = training_flow(PPO)

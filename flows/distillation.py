"""The on-policy distillation flow: each iteration is one step of NeMo RL's
``distillation_train``, one Prefect task run per stage, as
``nemo_rl_core.pipeline.algorithms.DISTILLATION`` declares it.

    [validate] -> prompts -> generate -> reward -> teacher (top-k logits) -> train -> checkpoint

Run locally without a server:
    python -m flows.distillation --config examples/configs/distillation_tiny.yaml
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

if __name__ == "__main__":  # the command line checks the config before loading the stack
    from flows.cli import run_cli
    from nemo_rl_core.algorithms.distillation_config import DistillationMasterConfig

    run_cli("distillation", DistillationMasterConfig)
else:
    from flows.loop import training_flow
    from nemo_rl_core.pipeline.algorithms import DISTILLATION

    distillation = training_flow(DISTILLATION)

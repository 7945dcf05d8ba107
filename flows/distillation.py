"""The on-policy distillation flow: each iteration is one step of NeMo RL's
``distillation_train``, one Prefect task run per stage, as
``nemo_rl_core.pipeline.algorithms.DISTILLATION`` declares it.

    [validate] -> prompts -> generate -> reward -> teacher (top-k logits) -> train -> checkpoint

Run locally without a server:
    python -m flows distillation --config examples/configs/distillation_tiny.yaml
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

from flows.cli import flow_or_command

distillation = flow_or_command("distillation", __name__)

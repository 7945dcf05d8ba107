"""``python -m flows <algorithm> --config FILE [--run-id ID] [key=value ...]``: one entry point
for every declared algorithm (grpo, ppo, sft, dpo, rm, distillation, eval); see
``flows.cli``."""

from flows.cli import main

if __name__ == "__main__":
    main()

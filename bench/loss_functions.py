"""Time the loss hot paths on CPU and compare each with its naive form.

Run: .venv/bin/python bench/loss_functions.py
Prints one line per measurement and the ratios; append the output to bench/RESULTS.md.
"""

import platform
import time
from collections.abc import Callable

import torch

from nemo_rl_core.algorithms.advantage_estimator import GeneralizedAdvantageEstimator
from nemo_rl_core.algorithms.config import PPOAdvEstimatorConfig
from nemo_rl_core.algorithms.loss import ClippedPGLossFn, next_token_logprobs_from_logits
from nemo_rl_core.algorithms.utils import calculate_global_valid_counts
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def best_of(fn: Callable[[], object], repeats: int = 10) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def naive_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def main() -> None:
    torch.manual_seed(0)
    batch, seq, vocab = 4, 512, 8192
    logits = torch.randn(batch, seq, vocab, requires_grad=True)
    ids = torch.randint(0, vocab, (batch, seq))

    def fwd_bwd(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            logits.grad = None
            fn(logits, ids).sum().backward()

        return run

    ours = best_of(fwd_bwd(next_token_logprobs_from_logits))
    naive = best_of(fwd_bwd(naive_logprobs))
    print(
        f"next-token logprobs fwd+bwd [{batch}x{seq}x{vocab}]: logsumexp-gather {ours * 1e3:.1f} ms, "
        f"log_softmax-gather {naive * 1e3:.1f} ms, ratio naive/ours {naive / ours:.2f}"
    )

    big_b, big_s = 64, 2048
    data = BatchedDataDict(
        token_mask=torch.ones(big_b, big_s),
        sample_mask=torch.ones(big_b),
        advantages=torch.randn(big_b, big_s),
        prev_logprobs=-torch.rand(big_b, big_s),
        generation_logprobs=-torch.rand(big_b, big_s),
        reference_policy_logprobs=-torch.rand(big_b, big_s),
    )
    seqs, toks = calculate_global_valid_counts(data)
    curr = (-torch.rand(big_b, big_s - 1)).requires_grad_(True)
    plain = ClippedPGLossFn({})
    knobs = ClippedPGLossFn(
        {
            "ratio_clip_c": 3.0,
            "use_importance_sampling_correction": True,
            "truncated_importance_sampling_ratio": 2.0,
            "truncated_importance_sampling_type": "tis",
            "use_on_policy_kl_approximation": True,
        }
    )

    def pg(loss_fn: ClippedPGLossFn) -> Callable[[], None]:
        def run() -> None:
            curr.grad = None
            loss_fn(
                next_token_logprobs=curr,
                data=data,
                global_valid_seqs=seqs,
                global_valid_toks=toks,
            )[0].backward()

        return run

    t_plain, t_knobs = best_of(pg(plain)), best_of(pg(knobs))
    print(
        f"ClippedPGLossFn fwd+bwd [{big_b}x{big_s}]: defaults {t_plain * 1e3:.1f} ms, "
        f"dual-clip+TIS+on-policy-KL {t_knobs * 1e3:.1f} ms, ratio {t_knobs / t_plain:.2f}"
    )

    gae = GeneralizedAdvantageEstimator(PPOAdvEstimatorConfig(name="gae").model_dump())
    values, rewards = torch.randn(big_b, big_s), torch.randn(big_b)
    prompt_ids = torch.arange(big_b)
    t_gae = best_of(
        lambda: gae.compute_advantage(prompt_ids, rewards, data["token_mask"], values=values), 3
    )
    print(f"GAE [{big_b}x{big_s}]: {t_gae * 1e3:.1f} ms ({t_gae / t_plain:.2f}x the PG loss step)")
    print(
        f"cpu: {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()

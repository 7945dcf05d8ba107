"""LoRA on the HF backend: ``policy.dtensor_cfg.lora_cfg`` through peft.

Only the adapters train and sit in the optimizer; the base weights stay as loaded. A
checkpoint holds the merged weights at its root (what vLLM and transformers load, so
generation samples from base + adapters) and the adapters alone in ``adapter/`` (what
peft loads, and what the next iteration's train stage continues from, over the base
model named by ``policy.model_name``, never over merged weights).
"""

import copy
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from transformers import PreTrainedModel

from nemo_rl_core.models.policy.config import LoraConfig

ADAPTER_DIR = "adapter"
# Fresh adapters draw their A matrices from this seed: every stage that starts them gets
# the same ones, so a rerun of the first train stage is bit-identical.
ADAPTER_INIT_SEED = 0


def peft_config(cfg: LoraConfig) -> PeftLoraConfig:
    """NeMo RL's LoRA keys as peft's config (``match_all_linear`` is peft's "all-linear")."""
    targets: str | list[str] = (
        "all-linear" if cfg.match_all_linear or not cfg.target_modules else cfg.target_modules
    )
    return PeftLoraConfig(
        r=cfg.dim,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        exclude_modules=cfg.exclude_modules or None,
        init_lora_weights=True,
        bias="none",
        task_type="CAUSAL_LM",
    )


def add_adapters(
    model: PreTrainedModel, cfg: LoraConfig, checkpoint: str | Path | None
) -> PeftModel:
    """``model`` with trainable adapters: those saved in ``checkpoint/adapter`` when it
    has them, else fresh ones (A per ``lora_A_init``, B zero: the model is unchanged)."""
    saved = Path(checkpoint) / ADAPTER_DIR if checkpoint is not None else None
    if saved is not None and (saved / "adapter_config.json").is_file():
        return PeftModel.from_pretrained(model, str(saved), is_trainable=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ADAPTER_INIT_SEED)
        wrapped = get_peft_model(model, peft_config(cfg))
        if cfg.lora_A_init == "xavier":
            for name, param in wrapped.named_parameters():
                if "lora_A" in name:
                    torch.nn.init.xavier_uniform_(param)
    return wrapped


def merged_model(model: PeftModel) -> PreTrainedModel:
    """A plain transformers model with the adapters folded into its weights (a copy)."""
    return copy.deepcopy(model).merge_and_unload()


def save_lora_checkpoint(model: PeftModel, path: str | Path) -> None:
    """Merged weights at ``path`` (HF layout), the adapters in ``path/adapter``."""
    merged_model(model).save_pretrained(str(path))
    model.save_pretrained(str(Path(path) / ADAPTER_DIR))

"""Fixtures shared by every test folder: locally built models (never downloaded)."""

from pathlib import Path

import pytest

from nemo_rl_core.models.local_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama (tied embeddings, fp32) with a locally trained tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen2 (qkv bias, untied embeddings, fp32)."""
    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-qwen2", "qwen2", tie_word_embeddings=False
    )

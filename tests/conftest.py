"""Shared fixtures. Engine tests start real vLLM engines on the CPU with the default model."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model_dir():
    from kveval.inputs.models import ModelError, prepare_default_model

    try:
        return prepare_default_model()
    except ModelError as error:  # pragma: no cover - the README install provides it
        pytest.fail(f"default model unavailable: {error}")


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))

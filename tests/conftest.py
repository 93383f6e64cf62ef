"""Shared fixtures. Engine tests start real vLLM engines on the CPU with the default model."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model_dir(tmp_path_factory):
    import fcntl

    from kveval.inputs.models import ModelError, prepare_default_model

    # Under pytest-xdist (make unit, make test: -n 2) every worker asks for it: on a fresh machine one
    # converts and the others wait for it instead of converting it again (their temp dirs share a parent).
    with open(tmp_path_factory.getbasetemp().parent / "default-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return prepare_default_model()
        except ModelError as error:  # pragma: no cover - the README install provides it
            pytest.fail(f"default model unavailable: {error}")


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))

"""A module's runs on the fake engine (KVEVAL_ENGINE=fake, no planted damage, no plots), in a directory of its own."""
from __future__ import annotations

from typing import Iterator

import pytest


def fake_engine_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator:
    """Yield a fresh directory while the fake engine is on; the environment is restored after (for a fixture)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("KVEVAL_ENGINE", "fake")
    patch.delenv("KVEVAL_FAKE_DAMAGE", raising=False)
    patch.setenv("KVEVAL_NO_PLOTS", "1")
    yield tmp_path_factory.mktemp(name)
    patch.undo()

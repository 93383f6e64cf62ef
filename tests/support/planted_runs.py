"""A small real-engine run on the planted model (K ×128 in layers 3 and 17) that the remedy and the
calibration tests share: two short prompts, generation and scoring only, no tasks, 1024 tokens."""
from __future__ import annotations

from pathlib import Path

import kveval
from tests.support.planted import plant
from tests.support.quiet import Quiet

PLANTED = [3, 17]
SHORT_COUNTS = {"short_256": 2, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 0}


def planted_run(default_model_dir: Path, root: Path, kv: list[str], kv_cache_memory: str, **options):
    """Plant the model under `root`, then `kveval.compare` it with `kv` at 1024 (`options` added)."""
    model = plant(default_model_dir, root / "model", tensor="k", factor=128, layers=PLANTED)
    return kveval.compare(model=str(model), kv=kv, max_model_len=[1024], kv_cache_memory=kv_cache_memory,
                          enforce_eager=True, suite="quick", tasks=["none"], out=root / "run", progress=Quiet(),
                          counts=SHORT_COUNTS, phases=("generation", "scoring"), **options)

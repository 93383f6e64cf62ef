"""Small shared readers over stored cell dicts."""
from __future__ import annotations

from functools import lru_cache

from kveval.defaults import BASELINE_KV  # noqa: F401 - the analyses import it from here
from kveval.inputs.kvspec import KVSpec, KVSpecError, parse_kv


@lru_cache(maxsize=None)
def stored_spec(text: str | None) -> KVSpec | None:
    """The KV configuration behind a spec text a run stored (a cell's `kv_cache_dtype`, the manifest's
    --kv values): the one place stored spec texts are read; None for a text this kveval cannot read.
    The user's --kv is parsed once, in run/options."""
    if not text:
        return None
    try:
        return parse_kv(text)
    except KVSpecError:
        return None


def generation_records(facts: dict | None) -> dict[str, dict]:
    """prompt_id -> generation record, or {} when the cell has none."""
    if not facts:
        return {}
    phase = (facts.get("phases") or {}).get("generation") or {}
    return {record["prompt_id"]: record for record in phase.get("records", [])}


def pool_tokens(facts: dict) -> int | None:
    return ((facts.get("capacity") or {}).get("kv_pool_tokens")) if facts.get("started") else None


def baseline_for(cells: dict[str, dict], facts: dict, baseline_kv: str = BASELINE_KV) -> dict | None:
    """The baseline cell at the same max_model_len (None when it is this cell or absent)."""
    if facts.get("kv_cache_dtype") == baseline_kv:
        return None
    same = [other for other in cells.values()
            if other.get("kv_cache_dtype") == baseline_kv and other.get("max_model_len") == facts.get("max_model_len")]
    # A started one first: where `auto` failed on the run's budget, its quality reference stands in.
    return next((other for other in same if other.get("started")), same[0] if same else None)

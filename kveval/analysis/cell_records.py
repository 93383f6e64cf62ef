"""Small shared readers over stored cells (`schema.CellResult`, typed)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Mapping, NamedTuple

from kveval.defaults import BASELINE_KV as BASELINE_KV  # the analyses import it from here
from kveval.files.schema import CellResult, GenerationRecord
from kveval.inputs.kvspec import KVSpec, KVSpecError, parse_kv


@lru_cache(maxsize=None)
def stored_spec(text: str | None) -> KVSpec | None:
    """The KV configuration behind a spec text a run stored (a cell's `kv_spec`, the manifest's
    --kv values): the one place stored spec texts are read; None for a text this kveval cannot read.
    The user's --kv is parsed once, in run/options."""
    if not text:
        return None
    try:
        return parse_kv(text)
    except KVSpecError:
        return None


class Prompt(NamedTuple):
    """What the analyses read of a workload prompt (a PromptSpec's dict, as workloads.jsonl holds it)."""

    id: str
    workload: str | None
    kind: str | None
    tokens: int | None        # len(token_ids); None where the dict has none


def prompts_of(workloads: Iterable[Mapping[str, Any]]) -> list[Prompt]:
    """The workload prompts' dicts, read once into typed `Prompt`s."""
    return [Prompt(spec["id"], spec.get("workload"), spec.get("kind"),
                   len(spec["token_ids"]) if "token_ids" in spec else None) for spec in workloads]


def generation_records(facts: CellResult | None) -> dict[str, GenerationRecord]:
    """prompt_id -> generation record, or {} when the cell has none."""
    if not facts:
        return {}
    phase = facts.phases.generation
    return {record.prompt_id: record for record in (phase.records or [])} if phase else {}


def pool_tokens(facts: CellResult) -> int | None:
    return facts.capacity.kv_pool_tokens if facts.started and facts.capacity else None


def baseline_for(cells: Mapping[str, CellResult], facts: CellResult,
                 baseline_kv: str = BASELINE_KV) -> CellResult | None:
    """The baseline cell at the same max_model_len (None when it is this cell or absent)."""
    if facts.kv_spec == baseline_kv:
        return None
    same = [other for other in cells.values()
            if other.kv_spec == baseline_kv and other.max_model_len == facts.max_model_len]
    # A started one first: where `auto` failed on the run's budget, its quality reference stands in.
    return next((other for other in same if other.started), same[0] if same else None)

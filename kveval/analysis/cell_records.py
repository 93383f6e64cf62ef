"""Small shared readers over stored cells (`schema.CellResult`, typed)."""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Union

from kveval.defaults import BASELINE_KV  # noqa: F401 - the analyses import it from here
from kveval.files import schema
from kveval.files.schema import CellResult, GenerationRecord
from kveval.inputs.kvspec import KVSpec, KVSpecError, parse_kv

# What the analyses' entry points accept: typed cells, or cell dicts as read from the files (tests and
# older callers), which are validated once, at the entry.
CellLike = Union[CellResult, dict]


def typed_cell(facts: CellLike, name: str = "<cell>") -> CellResult:
    """One cell as the typed model; a plain dict is validated (a schema.FileError names the bad field)."""
    if isinstance(facts, CellResult):
        return facts
    return schema.parse(CellResult, facts, f"cell {name}")


def typed_cells(cells: Mapping[str, CellLike]) -> dict[str, CellResult]:
    """Every cell typed (see `typed_cell`); already typed cells are passed through, not re-validated."""
    if all(isinstance(facts, CellResult) for facts in cells.values()):
        return cells if isinstance(cells, dict) else dict(cells)
    return {name: typed_cell(facts, name) for name, facts in cells.items()}


def typed_record(record: GenerationRecord | dict | None) -> GenerationRecord | None:
    """One generation record as the typed model; a plain dict (tests) is validated."""
    if record is None or isinstance(record, GenerationRecord):
        return record
    return GenerationRecord.model_validate(record)


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


def generation_records(facts: CellLike | None) -> dict[str, GenerationRecord]:
    """prompt_id -> generation record, or {} when the cell has none."""
    if not facts:
        return {}
    phase = typed_cell(facts).phases.generation
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

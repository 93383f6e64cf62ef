"""Requests of max_model_len a pool holds, said against vLLM's max_num_seqs (issue 41): the scheduler admits
no more than max_num_seqs at once, so where the pool holds more the text says so instead of promising them.
Pure: numbers in, words out."""
from __future__ import annotations

from kveval.files import schema


def max_num_seqs_of(evidence: schema.Evidence, cell: str) -> int | None:
    """The cell's max_num_seqs as its start-up row recorded it (runs from issue 41 on), else None."""
    for row in evidence.startup or []:
        if row.cell == cell and row.max_num_seqs is not None:
            return int(row.max_num_seqs)
    return None


def capped(held: float, max_num_seqs: int | None) -> str:
    """"" where the pool's room is within the cap (or the cap is unknown), else "; N at once (max_num_seqs)"."""
    if max_num_seqs is None or held <= max_num_seqs:
        return ""
    return f", {max_num_seqs} at once (max_num_seqs)"

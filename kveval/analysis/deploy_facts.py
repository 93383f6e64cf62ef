"""Two facts beside the deploy line (issue 41). Pure: evidence in, numbers and one line each out.

- Requests at once: a pool that holds N requests of max_model_len serves at most min(N, max_num_seqs) of
  them together, since vLLM's scheduler admits no more than max_num_seqs (recorded from the engine), so
  the review must not promise the pool's N where the cap is lower.
- What `--search` would add: a default run that found a remedy (layers kept in the model dtype) never tried
  calibrated scales or fewer kept layers (run/search.py's ladder), which may keep the pool and cost less.
"""
from __future__ import annotations

import math

from kveval.analysis.cell_records import BASELINE_KV, stored_spec
from kveval.files import schema


def _known(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _cell_figures(kv: str, length: int, evidence: schema.Evidence) -> tuple[float | None, int | None]:
    """(requests of max_model_len its pool holds, the engine's max_num_seqs) of the cell `kv` at `length`."""
    held = seqs = None
    for row in evidence.startup or []:
        if row.kv_spec == kv and row.max_model_len == length:
            held, seqs = _known(row.max_concurrency), _known(row.max_num_seqs)
    if seqs is None:   # the throughput phase records it too
        seqs = next((_known(r.max_num_seqs) for r in evidence.throughput or []
                     if r.kv_spec == kv and r.max_model_len == length and _known(r.max_num_seqs) is not None), None)
    return held, (int(seqs) if seqs is not None else None)


def concurrent_requests(kv: str, length: int, evidence: schema.Evidence) -> tuple[float | None, int | None, str | None]:
    """(requests of `length` tokens served at once, max_num_seqs, a line where the cap is below the pool's room)."""
    held, seqs = _cell_figures(kv, length, evidence)
    if seqs is None:
        return held, None, None
    at_once = min(held, seqs) if held is not None else None
    if held is None or held <= seqs:
        return at_once, seqs, None
    baseline, _ = _cell_figures(BASELINE_KV, length, evidence)
    line = (f"Requests at once: the pool holds {_count(held)} requests of {length:,} tokens, but vLLM admits at most "
            f"{seqs} (max_num_seqs, as the cells ran)")
    if baseline is not None and baseline >= seqs:
        return at_once, seqs, (line + f", as many as `{BASELINE_KV}` (its pool holds {_count(baseline)}): the extra KV "
                               "buys no concurrency at this length unless --max-num-seqs is raised.")
    if baseline is not None:
        line += f"; `{BASELINE_KV}`'s pool holds {_count(baseline)}"
    return at_once, seqs, line + ": raise --max-num-seqs to serve more."


def _count(requests: float) -> str:
    return f"{requests:,.1f}" if requests < 100 else f"{requests:,.0f}"


def search_note(kv: str, evidence: schema.Evidence) -> str | None:
    """One line where the deployed configuration keeps layers and the run did not --search."""
    spec = stored_spec(kv)
    if spec is None or not spec.keep or evidence.search is not None:
        return None
    return ("`--search` would add: calibrated K/V scales (fp8:scaled, fp8:scaled=head), which keep the whole 2× pool, "
            "and fewer kept layers, each judged by the same gate; run the same command with --search to compare "
            "their cost.")

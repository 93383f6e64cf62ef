"""The review's KV capacity section: each pool predicted from the model's KV layout and the budget,
next to the measured one, and the pool ratio against the baseline. Pure: evidence in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.files import schema
from kveval.files.rundir import RunDir
from kveval.render.markdown import fmt_int, fmt_pct, long_table


def capacity_section(evidence: schema.Evidence, layout: schema.KvLayout | None = None) -> str:
    """Predicted next to measured pools, so a pool that departs from the model's own arithmetic is seen.
    `layout` (the manifest's) explains a hybrid model's pool ratio."""
    rows = evidence.capacity_model
    if not rows:
        return ""  # runs that did not record the model's KV layout
    predicted = [r for r in rows if r.predicted_tokens]
    out = ["## KV capacity: predicted vs measured", ""]
    if layout is not None and layout.state_layers:
        return "\n".join(out + _state_model_lines(layout, rows))
    if not predicted:
        reasons = sorted({r.flag for r in rows if r.flag})
        return "\n".join(out + [f"_Not predicted: {'; '.join(reasons) or 'no budget known'}._"])
    sources = sorted({r.budget_source for r in predicted if r.budget_source})
    out += ["Each pool predicted from the model's KV layout and the budget: bytes per token = layers × KV heads × "
            "head dim × 2 (K and V) × bytes per element (1 for FP8; layers kept in the model dtype cost their full "
            "bytes), pool = ⌊budget ÷ (block size × bytes per token)⌋ × block size, as vLLM allocates whole blocks. "
            f"Budget: {', '.join(sources)}. A measured pool more than 3 % off the prediction is flagged.", ""]
    if any(r.layout_model == "hybrid" for r in rows):
        out[-1:] = [" Sliding-window layers follow vLLM's hybrid allocator: layers form groups that share one block's "
                    "tensors; a request takes ⌈L ÷ block⌉ blocks in each full-attention group and "
                    "⌈min(window − 1 + batched tokens, L) ÷ block⌉ + 1 in each sliding group; the pool is "
                    "blocks ÷ blocks per request × L tokens, as vLLM reports it.", ""]
    view = _pool_view(rows, {"bytes per token": [fmt_int(r.bytes_per_token) for r in rows],
                             "budget": [_mib(r.budget_bytes) for r in rows]},
                      {"longest max_model_len it holds": [fmt_int(r.predicted_max_model_len) for r in rows]})
    out.append(long_table(view, f"{len(view)} cells"))
    flagged = [r for r in rows if r.flag and r.predicted_tokens]
    if flagged:
        out += ["", *(f"- **{r.cell}**: {fmt_pct(100 * r.deviation)} — {r.flag}." for r in flagged)]
    out += ["", *_pool_ratio_lines(rows),
            "", f"![KV pool per max_model_len, measured and predicted]({RunDir.CAPACITY_PLOT})"]
    return "\n".join(out)


def _pool_ratio_lines(rows: list[schema.CapacityRow], explain: bool = True) -> list[str]:
    """What the FP8 / baseline pool ratio is at each length, and (`explain`) why it is what it is by bytes per
    token; a hybrid's section explains its own paging instead."""
    pairs = [r for r in rows if r.measured_ratio or r.predicted_ratio]
    lines = []
    if pairs:
        lines += ["Pool against the baseline at the same max_model_len:", ""]
        for r in sorted(pairs, key=lambda r: (r.max_model_len, r.cell)):
            measured = (f"measured {r.measured_ratio:.2f}×" if r.measured_ratio
                        else "not measured (a cell did not start)")
            predicted = f"predicted {r.predicted_ratio:.2f}×" if r.predicted_ratio else "not predicted"
            lines.append(f"- {r.cell}: {measured}, {predicted}")
        lines.append("")
    if not explain:
        return lines[:-1] if lines else lines
    lines.append(
        "Why the ratio is what it is: on one budget every cached token of every layer costs half as much in FP8, "
        "so the pool ratio is the ratio of bytes per token (2.00× for plain FP8, less with layers kept in the "
        "model dtype), in whole blocks, at every max_model_len; concurrency at a length is pool ÷ max_model_len. "
        "When the budget is what gpu_memory_utilization leaves, fixed costs (weights, activations, CUDA graphs) "
        "come off the top for both dtypes alike and do not change it. What does is memory FP8 does not shrink that "
        "grows with the number of requests, not their length — SSM state, a vision encoder's cache: with S bytes of "
        "it per request and b bytes per token, the ratio is (L·b + S) ÷ (L·b/2 + S), which is why a field report on "
        "a hybrid model saw 1.40× at 2K approach 1.94× at 64K. A measured ratio far from the predicted one here "
        "means the cells did not get the same memory (see the flags), not that FP8 stores more.")
    return lines


def _state_model_lines(layout: schema.KvLayout, rows: list[schema.CapacityRow]) -> list[str]:
    """A hybrid model: which layers cache K/V, the state FP8 leaves alone, how vLLM pages both, and the pools."""
    state = layout.state_bytes_per_request
    kinds = ", ".join(layout.layer_kinds) or "not named"
    lines = [f"A hybrid model: {len(layout.cached_layers)} of its {layout.layers} layers cache K and V per token; "
             f"{len(layout.state_layers)} keep a fixed per-request state instead (layer kinds: {kinds}). Bytes per "
             "token count the attention layers only. The state "
             + (f"({state / 2 ** 20:,.2f} MiB per request in the model dtype, from the config's sizes) " if state
                else "(its size is not known here for this layer type) ")
             + "is not stored in FP8. vLLM pages it with the K/V cache: it raises the attention block size until one "
               "block's K/V page holds a layer's state (so FP8's smaller tokens make longer blocks) and pads the state "
               "to that page; a block costs one page per layer of a group, and a request holds ⌈L ÷ block⌉ blocks per "
               "attention group and per state group 1 block with prefix caching off (kveval's cells) or 2 with it on "
               "(vLLM's 'align' state mode, the default of `vllm serve`: a deployment then holds fewer requests than the "
               "pools measured here). "
               "Predicted pool = ⌊budget ÷ block bytes⌋ ÷ blocks per request × L tokens, on the block size each engine "
               "chose. So FP8 gains less than 2×, least at short lengths where the state pages weigh most.", ""]
    view = _pool_view(rows, {"bytes per token (attention layers)": [fmt_int(r.bytes_per_token) for r in rows],
                             "block size": [fmt_int(r.block_size) for r in rows]})
    flagged = [r for r in rows if r.flag]
    notes = ["", *(f"- **{r.cell}**: {fmt_pct(100 * r.deviation) + ' — ' if r.deviation is not None else ''}{r.flag}."
                   for r in flagged)] if flagged else []
    return lines + [long_table(view, f"{len(view)} cells"), *notes, "", *_pool_ratio_lines(rows, explain=False)]


def _pool_view(rows: list[schema.CapacityRow], before: dict[str, list], after: dict[str, list] | None = None
               ) -> pd.DataFrame:
    """Per cell: `before` columns, the predicted and measured pools and their gap, then `after` columns."""
    return pd.DataFrame({
        "cell": [r.cell for r in rows], **before,
        "predicted tokens": [fmt_int(r.predicted_tokens) for r in rows],
        "measured tokens": [fmt_int(r.measured_tokens) if r.started else "did not start" for r in rows],
        "Δ": [fmt_pct(100 * r.deviation) if r.deviation is not None else "" for r in rows],
        **(after or {}),
    })


def _mib(value) -> str:
    return "" if value is None else f"{value / 2 ** 20:,.1f} MiB"

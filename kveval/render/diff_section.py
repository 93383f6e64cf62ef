"""The review's output diff sections: greedy outputs against the baseline (and the baseline against
itself at another max_model_len), then the first diverging output per workload and cell. Pure:
evidence in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.diff import PAIR_COLUMNS, SUMMARY_COLUMNS
from kveval.files import schema
from kveval.render.markdown import escape_cell, fmt_float, fmt_int, fmt_share, long_table, rows_frame, table

MAX_EXAMPLES = 24
_NO_EXCERPT = schema.DiffExcerpt(char_offset=None, before=None, candidate=None, reference=None)


def _diff_view(summary: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "workload": summary.workload, "cell": summary.cell, "vs": summary.reference,
        "identical": [f"{int(i)}/{int(c)}" + (f" (+{int(p)} cut short)" if p and not pd.isna(p) else "")
                      for i, c, p in zip(summary.identical, summary.compared, summary.prefix_only)],
        "exact match": summary.exact_match_rate.map(fmt_share),
        "median similarity": summary.median_similarity.map(lambda v: fmt_float(v, 3)),
        "median length ratio": summary.median_length_ratio.map(lambda v: fmt_float(v, 2)),
        "earliest divergent token": summary.earliest_divergence.map(fmt_int),
    })


def _identical_sentence(pairs: pd.DataFrame) -> str:
    sentence = f"**{int(pairs.identical.astype(bool).sum())} of {len(pairs)}** outputs identical."
    if "prefix_only" in pairs and pairs.prefix_only.fillna(False).astype(bool).any():
        cut = int(pairs.prefix_only.fillna(False).astype(bool).sum())
        sentence += (f" {cut} more are identical until one output stopped early (\"cut short\": e.g. a smaller "
                     "max_model_len left less room) — a length difference, not a divergence.")
    return sentence


def diff_section(evidence: schema.Evidence) -> str:
    summary = rows_frame(evidence.diff.summary, columns=SUMMARY_COLUMNS)
    pairs = rows_frame(evidence.diff.pairs, columns=PAIR_COLUMNS)
    out = [f"## Output diff vs `{BASELINE_KV}`", "",
           f"Greedy outputs compared token by token with the `{BASELINE_KV}` cell at the same max_model_len. "
           "Similarity: character-level ratio of the two texts (1 = same text); length ratio: output tokens / "
           "reference output tokens; earliest divergent token: the first differing token index in the workload."]
    kv = summary[summary.comparison == "kv"]
    compared = set(kv.cell)
    unjudged = [name for name, cell in evidence.cells.items()
                if cell.started and cell.kv_spec != BASELINE_KV and name not in compared]
    if unjudged:
        out += ["", "Not judged (no started `auto` cell at the same max_model_len): " + ", ".join(unjudged) + "."]
    if kv.empty:
        out += ["", f"_No pair to compare: a non-`{BASELINE_KV}` cell and its `{BASELINE_KV}` baseline at the same "
                    "max_model_len must both have started._"]
    else:
        out += ["", _identical_sentence(pairs[pairs.comparison == "kv"]), "",
                long_table(_diff_view(kv), f"{len(kv)} rows: each workload in each cell", untrusted=("workload",))]
    out += ["", f"### Noise reference: `{BASELINE_KV}` vs `{BASELINE_KV}` at another max_model_len", "",
            "Same KV dtype, a different engine shape: how much greedy outputs move without any KV-dtype change."]
    length = summary[summary.comparison == "length"]
    if length.empty:
        out += ["", f"_No reference: it needs two started `{BASELINE_KV}` cells that accepted the same prompt._"]
    else:
        out += ["", _identical_sentence(pairs[pairs.comparison == "length"]), "",
                long_table(_diff_view(length), f"{len(length)} rows: each workload in each cell",
                           untrusted=("workload",))]
    return "\n".join(out)


def _excerpt_rows(example: schema.DiffExample) -> pd.DataFrame:
    excerpt = example.excerpt or _NO_EXCERPT
    before = excerpt.before or ""
    lead = "…" if (excerpt.char_offset or 0) > len(before) else ""
    column = "text around the divergence (▸ marks where the outputs part)"
    return pd.DataFrame([
        {"cell": example.reference, column: f"{lead}{before} ▸ {excerpt.reference or '(ends)'}"},
        {"cell": example.cell, column: f"{lead}{before} ▸ {excerpt.candidate or '(ends)'}"},
    ])


def diff_examples_section(evidence: schema.Evidence) -> str:
    examples = [e for e in evidence.diff.examples if e.comparison == "kv"]
    if not examples:
        return ""
    out = [f"### First diverging output per workload and cell (vs `{BASELINE_KV}`)"]
    for example in examples[:MAX_EXAMPLES]:
        excerpt = example.excerpt or _NO_EXCERPT
        out += ["", f"**{escape_cell(example.workload, None)} · {example.cell} vs {example.reference}** — "
                    f"prompt {escape_cell(example.prompt, None)}, first differing token "
                    f"{fmt_int(example.first_divergent_token)}, character {fmt_int(excerpt.char_offset)}, "
                    f"similarity {fmt_float(example.similarity, 3)}",
                "", table(_excerpt_rows(example), untrusted=tuple(_excerpt_rows(example).columns))]
    if len(examples) > MAX_EXAMPLES:
        out += ["", f"_{len(examples) - MAX_EXAMPLES} more in `tables/diff_examples.csv`._"]
    return "\n".join(out)

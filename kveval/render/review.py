"""review.md from the evidence and the verdict (pure: manifest, evidence and verdict in, markdown out).

The verdict leads; then start-up, acceptance and speed; then the quality evidence (output diff,
degeneration, teacher-forced divergence, long-context task accuracy). Model output and engine messages are untrusted text:
always escaped with `markdown.escape_cell` (or a table's `untrusted` columns).
"""
from __future__ import annotations

import re

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.degeneration import DETECTORS, FINDING_COLUMNS, INFORMATIONAL_DETECTORS
from kveval.analysis.diff import PAIR_COLUMNS, SUMMARY_COLUMNS
from kveval.gate import Verdict
from kveval.render.capacity_section import capacity_section
from kveval.render.diagnosis_section import render_diagnosis_section
from kveval.render.divergence_plot import NOISE_KINDS
from kveval.render.markdown import escape_cell, escape_name, fmt_float, fmt_int, fmt_pct, fmt_share, fmt_sig, shorten, table
from kveval.files.rundir import RunDir
from kveval.render.recommendation_section import recommendation_section
from kveval.render.remedy_section import remedy_section
from kveval.render.run_section import run_section
from kveval.render.startup_section import LOG_LINE_START, startup_section
from kveval.render.tasks_section import tasks_section
from kveval.render.verdict_section import verdict_section

__all__ = ["LOG_LINE_START", "MAX_EXAMPLES", "MAX_FINDING_ROWS", "render_review"]

MAX_FINDING_ROWS = 30
MAX_EXAMPLES = 24


def render_review(manifest: dict, evidence: dict, verdict: Verdict) -> str:
    """The whole review. The manifest gives the run's description (command, versions, hardware);
    every figure comes from `evidence` (evidence.build_evidence) and every judgement from `verdict`."""
    sections = [
        _title(manifest),
        verdict_section(verdict, evidence, manifest),
        remedy_section(evidence),
        recommendation_section(evidence, verdict, manifest),
        run_section(manifest, evidence),
        startup_section(evidence),
        capacity_section(evidence),
        _acceptance_section(evidence),
        _speed_section(evidence),
        _throughput_section(evidence),
        _diff_section(evidence),
        _diff_examples_section(evidence),
        _degeneration_section(evidence),
        _divergence_section(evidence),
        tasks_section(manifest, evidence),
        *_diagnosis_sections(evidence),
        _samples_section(evidence),
        _footer(manifest),
    ]
    return "\n\n".join(s for s in sections if s).rstrip() + "\n"


def _title(manifest: dict) -> str:
    return f"# kveval review — {escape_cell(manifest.get('model', {}).get('name'), None)}"


def _acceptance_section(evidence: dict) -> str:
    acceptance = evidence.get("acceptance") or {}
    matrix = pd.DataFrame(acceptance.get("matrix") or [])
    if matrix.empty:
        return ""
    # Quality references (auto started only to judge quality) have no acceptance column: they are not a finding.
    started = [name for name, cell in (evidence.get("cells") or {}).items()
               if cell.get("started") and name in matrix.columns]
    symbols = {"accepted": "✓", "rejected": "✗ rejected", "error": "⚠ error", "not run": "—", "not started": ""}
    view = matrix[["prompt", "prompt_tokens", *started]].copy()
    view["prompt_tokens"] = view.prompt_tokens.map(fmt_int)
    for name in started:
        view[name] = view[name].map(lambda status: symbols.get(status, status))
    out = ["## Prompt acceptance", "",
           "Every prompt was submitted to every started cell; ✗ means the engine refused it "
           "(nothing is predicted or truncated).", "", table(view, names=("prompt",))]
    refused = pd.DataFrame(acceptance.get("rejections") or [], columns=["cell", "prompt", "kind", "message"])
    if not refused.empty:
        out += ["", "Engine messages (the first refusal of each cell; every message is in the cell files):", ""]
        for cell, group in refused.groupby("cell", sort=False):
            first = group.iloc[0]
            others = (f" (+{len(group) - 1} more: {', '.join(escape_name(p) for p in group.prompt.iloc[1:])})"
                      if len(group) > 1 else "")
            out.append(f"- {cell} / {escape_name(first.prompt)} ({first.kind}){others}: "
                       f"{escape_cell(first.message, 400)}")
    return "\n".join(out)


def _speed_section(evidence: dict) -> str:
    speed = pd.DataFrame(evidence.get("speed") or [])
    if speed.empty:
        return ""
    measured = speed[speed.runs > 0]
    view = pd.DataFrame({
        "workload": measured.workload,
        "cell": measured.cell,
        "prompt tokens": measured.prompt_tokens.map(fmt_int),
        "runs": measured.runs,
        "new tokens": measured.decoded_tokens.map(fmt_int) if "decoded_tokens" in measured else "",
        "TTFT ms (median)": measured.ttft_ms.map(lambda v: fmt_float(v, 1)),
        "TTFT range": [f"{fmt_float(a, 1)}–{fmt_float(b, 1)}" for a, b in zip(measured.ttft_ms_min, measured.ttft_ms_max)],
        f"Δ TTFT vs {BASELINE_KV}": _deltas(measured, "ttft_delta_pct", "ttft_vs_noise"),
        "decode tok/s (median)": measured.decode_tok_s.map(lambda v: fmt_float(v, 1)),
        "decode range": [f"{fmt_float(a, 1)}–{fmt_float(b, 1)}"
                         for a, b in zip(measured.decode_tok_s_min, measured.decode_tok_s_max)],
        f"Δ decode vs {BASELINE_KV}": _deltas(measured, "decode_delta_pct", "decode_vs_noise"),
    })
    options = evidence.get("speed_settings") or {}
    return "\n".join([
        "## Speed (concurrency 1)", "",
        "TTFT and decode tok/s from vLLM's per-request stats; each run decodes the same number of new tokens "
        "in every cell (ignore_eos; fewer than asked only where the prompt nearly fills max_model_len). "
        "Median over the measured runs after warm-up; Δ is against the `auto` cell at the same max_model_len.",
        "" if options.get("enforce_eager") is None else f"enforce_eager: {options.get('enforce_eager')}.",
        "", table(view), *(["", note] if (note := _speed_note(measured)) else []),
    ])


_NOISE_WORDS = {"within": " (within run-to-run spread)", "too few runs": " (too few runs to tell from noise)",
                "beyond": ""}


def _deltas(measured: pd.DataFrame, delta: str, noise: str) -> list[str]:
    """Δ % against the baseline; said to be noise where the ranges overlap (runs before issue 10: Δ only)."""
    verdicts = measured[noise] if noise in measured else [None] * len(measured)
    return [fmt_pct(d) + (_NOISE_WORDS.get(v, "") if fmt_pct(d) else "") for d, v in zip(measured[delta], verdicts)]


def _speed_note(measured: pd.DataFrame) -> str:
    if "decode_vs_noise" not in measured or measured.decode_vs_noise.isna().all():
        return ""  # runs before issue 10, or nothing compared against a baseline
    beyond = measured[(measured.decode_vs_noise == "beyond") | (measured.ttft_vs_noise == "beyond")]
    if beyond.empty:
        return ("No speed difference against the baseline exceeds the run-to-run spread: FP8 is neither shown faster "
                "nor slower here.")
    return ("Differences beyond the run-to-run spread (the measured ranges do not overlap): "
            + "; ".join(f"{r.cell} {r.workload}" for r in beyond.itertuples()) + ".")


def _throughput_section(evidence: dict) -> str:
    rows = pd.DataFrame(evidence.get("throughput") or [])
    if rows.empty:
        return ""
    view = pd.DataFrame({
        "cell": rows.cell, "concurrency": rows.concurrency.map(fmt_int), "prompt tokens": rows.prompt_tokens.map(fmt_int),
        "requests/s": rows.requests_per_s.map(lambda v: fmt_float(v, 2)),
        "output tok/s": rows.output_tok_s.map(lambda v: fmt_float(v, 1)),
        f"× {BASELINE_KV}": rows.output_tok_s_vs_baseline.map(lambda v: fmt_float(v, 2) + "×" if fmt_float(v) else ""),
        "TTFT ms p50 / p99": [f"{fmt_float(a, 0)} / {fmt_float(b, 0)}" if fmt_float(a) else ""
                              for a, b in zip(rows.ttft_ms_p50, rows.ttft_ms_p99)],
        "ITL ms p50 / p99": [f"{fmt_float(a, 1)} / {fmt_float(b, 1)}" if fmt_float(a) else ""
                             for a, b in zip(rows.itl_ms_p50, rows.itl_ms_p99)],
        "preemptions": rows.preemptions.map(fmt_int),
        "error": rows.error.map(lambda e: escape_cell(e, 160) if isinstance(e, str) else ""),
    })
    out = ["## Throughput under concurrency", "",
           "At each level N, N copies of one long prompt are submitted at once and each decodes the same number of "
           "tokens; vLLM runs as many together as the KV pool (and max_num_seqs) allows and queues the rest. One run "
           "per level, so small differences are not significant. × auto: output tokens/s against the `auto` cell at "
           "the same length and level.", "", table(view)]
    out += _throughput_findings(rows)
    if rows.output_tok_s.notna().any():
        out += ["", f"![output tokens/s and TTFT against concurrency]({RunDir.THROUGHPUT_PLOT})"]
    return "\n".join(out)


def _throughput_findings(rows: pd.DataFrame) -> list[str]:
    """Per tested cell: the levels where it outran or trailed the baseline by more than 10 %."""
    lines = []
    for cell, group in rows[rows.output_tok_s_vs_baseline.notna()].groupby("cell", sort=False):
        ahead = [int(c) for c, r in zip(group.concurrency, group.output_tok_s_vs_baseline) if r > 1.10]
        behind = [int(c) for c, r in zip(group.concurrency, group.output_tok_s_vs_baseline) if r < 0.90]
        parts = []
        if ahead:
            parts.append(f"ahead of `{BASELINE_KV}` at concurrency {', '.join(map(str, ahead))}")
        if behind:
            parts.append(f"behind at {', '.join(map(str, behind))}")
        lines.append(f"- **{cell}**: " + ("; ".join(parts) if parts else f"within 10 % of `{BASELINE_KV}` at every level")
                     + f" (its pool holds {fmt_float(group.max_concurrency.iloc[0], 1)} requests of max_model_len).")
    return ["", *lines] if lines else []


# --- output diff -----------------------------------------------------------------------------------

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


def _diff_section(evidence: dict) -> str:
    summary = pd.DataFrame(evidence["diff"]["summary"], columns=SUMMARY_COLUMNS)
    pairs = pd.DataFrame(evidence["diff"]["pairs"], columns=PAIR_COLUMNS)
    out = [f"## Output diff vs `{BASELINE_KV}`", "",
           f"Greedy outputs compared token by token with the `{BASELINE_KV}` cell at the same max_model_len. "
           "Similarity: character-level ratio of the two texts (1 = same text); length ratio: output tokens / "
           "reference output tokens; earliest divergent token: the first differing token index in the workload."]
    kv = summary[summary.comparison == "kv"]
    compared = set(kv.cell)
    unjudged = [name for name, cell in (evidence.get("cells") or {}).items()
                if cell.get("started") and cell.get("kv_cache_dtype") != BASELINE_KV and name not in compared]
    if unjudged:
        out += ["", "Not judged (no started `auto` cell at the same max_model_len): " + ", ".join(unjudged) + "."]
    if kv.empty:
        out += ["", f"_No pair to compare: a non-`{BASELINE_KV}` cell and its `{BASELINE_KV}` baseline at the same "
                    "max_model_len must both have started._"]
    else:
        out += ["", _identical_sentence(pairs[pairs.comparison == "kv"]), "",
                table(_diff_view(kv), untrusted=("workload",))]
    out += ["", f"### Noise reference: `{BASELINE_KV}` vs `{BASELINE_KV}` at another max_model_len", "",
            "Same KV dtype, a different engine shape: how much greedy outputs move without any KV-dtype change."]
    length = summary[summary.comparison == "length"]
    if length.empty:
        out += ["", f"_No reference: it needs two started `{BASELINE_KV}` cells that accepted the same prompt._"]
    else:
        out += ["", _identical_sentence(pairs[pairs.comparison == "length"]), "",
                table(_diff_view(length), untrusted=("workload",))]
    return "\n".join(out)


def _excerpt_rows(example: dict) -> pd.DataFrame:
    excerpt = example.get("excerpt") or {}
    before = excerpt.get("before") or ""
    lead = "…" if (excerpt.get("char_offset") or 0) > len(before) else ""
    column = "text around the divergence (▸ marks where the outputs part)"
    return pd.DataFrame([
        {"cell": example["reference"], column: f"{lead}{before} ▸ {excerpt.get('reference') or '(ends)'}"},
        {"cell": example["cell"], column: f"{lead}{before} ▸ {excerpt.get('candidate') or '(ends)'}"},
    ])


def _diff_examples_section(evidence: dict) -> str:
    examples = [e for e in evidence["diff"]["examples"] if e.get("comparison") == "kv"]
    if not examples:
        return ""
    out = [f"### First diverging output per workload and cell (vs `{BASELINE_KV}`)"]
    for example in examples[:MAX_EXAMPLES]:
        excerpt = example.get("excerpt") or {}
        out += ["", f"**{escape_cell(example['workload'], None)} · {example['cell']} vs {example['reference']}** — "
                    f"prompt {escape_cell(example['prompt'], None)}, first differing token "
                    f"{fmt_int(example.get('first_divergent_token'))}, character {fmt_int(excerpt.get('char_offset'))}, "
                    f"similarity {fmt_float(example.get('similarity'), 3)}",
                "", table(_excerpt_rows(example), untrusted=tuple(_excerpt_rows(example).columns))]
    if len(examples) > MAX_EXAMPLES:
        out += ["", f"_{len(examples) - MAX_EXAMPLES} more in `tables/diff_examples.csv`._"]
    return "\n".join(out)


# --- degeneration ----------------------------------------------------------------------------------

def _new_findings_table(new: pd.DataFrame) -> str:
    view = pd.DataFrame({"cell": new.cell, "workload": new.workload, "prompt": new.prompt, "detector": new.detector,
                         "detail": new.detail, "excerpt": new.excerpt.map(lambda t: shorten(t or "", 160))})
    untrusted = ("workload", "prompt", "detail", "excerpt")
    if "baseline_excerpt" in new and new.baseline_excerpt.notna().any():  # the baseline's answer, beside it
        view[f"{BASELINE_KV}'s output"] = new.baseline_excerpt.map(lambda t: shorten(t if isinstance(t, str) else "", 160))
        untrusted += (f"{BASELINE_KV}'s output",)
    text = table(view.head(MAX_FINDING_ROWS), untrusted=untrusted)
    if len(view) > MAX_FINDING_ROWS:
        text += f"\n\n_{len(view) - MAX_FINDING_ROWS} more in `tables/degeneration_findings.csv`._"
    return text


def _already_table(old: pd.DataFrame) -> str:
    counts = old.groupby(["cell", "detector"], sort=False)["prompt"].nunique().reset_index(name="outputs")
    return table(counts.assign(outputs=counts.outputs.map(fmt_int)))


def _already_section(old: pd.DataFrame, nothing_new: bool) -> str:
    if old.empty:
        return ("None: no detector fired on any output, the baseline's included." if nothing_new else
                f"None: the `{BASELINE_KV}` outputs show no finding.")
    return (f"Findings in `{BASELINE_KV}` cells, and findings in other cells that the `{BASELINE_KV}` output for the "
            "same prompt shows too (not counted against the cell), as outputs per detector:\n\n" + _already_table(old))


def _degeneration_cells_table(cells: dict) -> str:
    rows = []
    for cell, entry in cells.items():
        fired = ", ".join(f"{d} {n}" for d, n in entry["detectors"].items() if n and d not in INFORMATIONAL_DETECTORS)
        rows.append({"cell": cell, "outputs": fmt_int(entry["outputs"]),
                     "with findings": fmt_int(entry["outputs_with_findings"]),
                     f"new vs {BASELINE_KV}": "—" if entry["kv_cache_dtype"] == BASELINE_KV else
                     "not judged: no baseline" if entry.get("judged_outputs") == 0 else fmt_int(entry["new_degenerate"]),
                     "findings by detector": fired or "none",
                     "stopped at the token limit": fmt_share(entry["token_limit_rate"])})
    return table(pd.DataFrame(rows))


def _degeneration_section(evidence: dict) -> str:
    degeneration = evidence["degeneration"]
    findings = pd.DataFrame(degeneration["findings"], columns=FINDING_COLUMNS)
    failing = findings[~findings.detector.isin(INFORMATIONAL_DETECTORS)]
    judged = failing[failing.new_vs_baseline.notna()]
    new = judged[judged.new_vs_baseline.astype(bool)]
    old = judged[~judged.new_vs_baseline.astype(bool)]
    unjudged = failing[failing.new_vs_baseline.isna()]
    # The detectors of the run that made the evidence: a re-render names what was scanned then.
    detectors = ", ".join(d for d in degeneration.get("detectors", DETECTORS) if d not in INFORMATIONAL_DETECTORS)
    out = ["## Degeneration", "",
           f"Every accepted output is scanned by: {detectors} (hit_token_limit is informational). A finding counts "
           f"against a cell only when the `{BASELINE_KV}` output for the same prompt does not show the same detector.",
           "", f"### New in non-`{BASELINE_KV}` cells", ""]
    if not degeneration["cells"]:
        out.append("_No started cell produced an output to scan._")
        return "\n".join(out)
    scanned = any(e["outputs"] for e in degeneration["cells"].values() if e["kv_cache_dtype"] != BASELINE_KV)
    out.append(_new_findings_table(new) if not new.empty else
               f"Nothing new: no detector fired on a non-`{BASELINE_KV}` output that the `{BASELINE_KV}` output for "
               "the same prompt does not also show." if scanned else
               f"Nothing to scan: no non-`{BASELINE_KV}` cell produced an output.")
    if not unjudged.empty:
        counts = unjudged.groupby("cell", sort=False)["prompt"].nunique()
        out += ["", f"Not judged (no `{BASELINE_KV}` output for the same prompt, so nothing says whether it is new): "
                + ", ".join(f"{cell} {n} output{'s' if n != 1 else ''}" for cell, n in counts.items()) + "."]
    out += ["", "### Already in the baseline", "", _already_section(old, nothing_new=new.empty)]
    out += ["", "### Per cell", "", _degeneration_cells_table(degeneration["cells"])]
    return "\n".join(out)


# --- teacher-forced divergence ---------------------------------------------------------------------

_KIND_LABELS = {"kv": "KV dtype", "noise_batch": "noise: another batch", "noise_length": "noise: another max_model_len"}


def _figures(s: dict) -> dict:
    se = f" ± {100 * s['top1_agreement_se']:.1f}" if s.get("top1_agreement_se") is not None else ""
    return {"n": fmt_int(s.get("n")), "KL mean": fmt_sig(s.get("kl_mean")), "KL median": fmt_sig(s.get("kl_median")),
            "KL p90": fmt_sig(s.get("kl_p90")), "KL p99": fmt_sig(s.get("kl_p99")), "KL max": fmt_sig(s.get("kl_max")),
            "top-1 agreement": fmt_share(s.get("top1_agreement")) + se,
            "|Δp| mean": fmt_sig(s.get("abs_dp_mean")), "|Δp| p99": fmt_sig(s.get("abs_dp_p99"))}


def _comparison_label(comp: dict) -> str:
    return comp["cell"] if comp["kind"] == "noise_batch" else f"{comp['cell']} vs {comp['reference']}"


def _divergence_table(divergence: dict) -> str:
    rows = [{"comparison": _comparison_label(c), "kind": _KIND_LABELS.get(c["kind"], c["kind"]), **_figures(c["summary"])}
            for c in divergence["comparisons"]]
    floor = divergence.get("noise_floor")
    if floor:
        disagreement = floor.get("top1_disagreement")
        rows.append({"comparison": "**noise floor** (worst noise row)", "kind": "noise",
                     **_figures({"kl_mean": floor.get("kl_mean"), "kl_p99": floor.get("kl_p99"),
                                 "top1_agreement": None if disagreement is None else 1 - disagreement})})
    return table(pd.DataFrame(rows))


def _bucket_table(divergence: dict) -> str:
    rows = []
    for comp in divergence["comparisons"]:
        for bucket in comp.get("buckets", []):
            figures = _figures(bucket)
            rows.append({"comparison": _comparison_label(comp), "kind": _KIND_LABELS.get(comp["kind"], comp["kind"]),
                         "positions": bucket["bucket"], **figures})
    return table(pd.DataFrame(rows))


def _top_k_text(top_k: list) -> str:
    return f"k={', '.join(str(k) for k in top_k)}" if top_k else "k unknown: no cell scored"


def _divergence_section(evidence: dict) -> str:
    divergence = evidence["divergence"]
    out = ["## Teacher-forced divergence", "",
           "Every cell scored the same token sequences (the reference cell's greedy continuations and plain documents) "
           "with prompt logprobs, so each position compares two next-token distributions over the same history. "
           f"KL(`{BASELINE_KV}` ‖ cell) in nats, over the reference top-k ({_top_k_text(divergence.get('top_k'))}) plus "
           "a rest bucket: a lower bound on the full-vocabulary KL. Top-1 agreement: positions with the same most "
           "likely token (± 1 s.e., in points); |Δp|: change in the probability of the actual next token. Noise rows "
           f"compare `{BASELINE_KV}` with itself; the noise floor beside the KV rows is what no KV change looks like here."]
    if divergence["comparisons"]:
        out += ["", _divergence_table(divergence)]
    else:
        out += ["", "_No comparison: a non-`auto` cell and an `auto` cell must both have started and scored._"]
    notes = []
    for entry in divergence.get("unmatched", []):
        notes.append(f"- {entry['cell']}: not compared ({escape_cell(entry.get('reason'), 200)})")
    for comp in divergence["comparisons"]:
        if comp["kind"] == "kv" and comp.get("same_length") is False:
            notes.append(f"- {comp['cell']}: no `{BASELINE_KV}` cell started at its max_model_len; compared with "
                       f"{comp['reference']} on the sequences both scored.")
    if notes:
        out += ["", *notes]
    if any(c.get("buckets") for c in divergence["comparisons"]):
        out += ["", "### By position", "", "The same figures per absolute token-position bucket.", "",
                _bucket_table(divergence)]
        if any(c.get("buckets") and c["kind"] not in NOISE_KINDS for c in divergence["comparisons"]):
            out += ["", f"![KL and top-1 agreement by token position]({RunDir.KL_POSITION_PLOT})"]
    return "\n".join(out)


def _samples_section(evidence: dict) -> str:
    """The first short prompt's answer in every started cell, escaped, so a reader sees the text."""
    samples = evidence.get("sample_outputs") or {}
    rows = [{"cell": row["cell"], "tokens": row.get("tokens"), "finish": row.get("finish"),
             "output (start)": shorten(row.get("text") or "", 240)} for row in samples.get("rows") or []]
    if not rows:
        return ""
    name = samples["prompt"]
    # A plain id reads best as code; anything else is escaped text (a code span cannot be escaped).
    shown = f"`{name}`" if re.fullmatch(r"[\w.:\-]+", str(name)) else escape_name(name)
    return "\n".join([f"## Sample outputs — {shown}", "",
                      table(pd.DataFrame(rows), untrusted=("output (start)",))])


def _footer(manifest: dict) -> str:
    return ("---\nGenerated by kveval from the stored run directory; `kveval report DIR` re-renders it and "
            "`kveval gate DIR` re-judges it without an engine. Every figure: `results.json` and `tables/*.csv`; "
            "per-cell facts: `cells/<cell>.json`; vLLM's own logs: `cells/<cell>.log`.")


# --- diagnosis and remedy --------------------------------------------------------------------------

def _diagnosis_sections(evidence: dict) -> list[str]:
    diagnoses = evidence.get("diagnosis") or {}
    if not diagnoses:
        return []
    return ["\n".join(render_diagnosis_section(diagnosis, RunDir.KV_RANGE_PLOT if not diagnosis.get("error") else None))
            + ("" if len(diagnoses) == 1 else f"\n\n_(for {dtype})_") for dtype, diagnosis in diagnoses.items()]

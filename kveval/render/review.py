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
from kveval.gate import NOTE, PASS, Verdict
from kveval.render.diagnosis_section import render_diagnosis_section
from kveval.render.divergence_plot import NOISE_KINDS
from kveval.render.headline import deploy_line, headline
from kveval.render.markdown import escape_cell, escape_name, fmt_float, fmt_int, fmt_pct, fmt_share, fmt_sig, table
from kveval.files.rundir import RunDir
from kveval.render.tasks_section import tasks_section

MAX_FINDING_ROWS = 30
MAX_EXAMPLES = 24


def render_review(manifest: dict, evidence: dict, verdict: Verdict) -> str:
    """The whole review. The manifest gives the run's description (command, versions, hardware);
    every figure comes from `evidence` (evidence.build_evidence) and every judgement from `verdict`."""
    sections = [
        _title(manifest),
        _verdict_section(verdict, evidence, manifest),
        _remedy_section(evidence),
        _recommendation_section(evidence, verdict, manifest),
        _run_section(manifest, evidence),
        _startup_section(evidence),
        _capacity_model_section(evidence),
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


# --- verdict ---------------------------------------------------------------------------------------

def _bullet(text: str) -> str:
    """A verdict reason: kveval's own sentence (cell names are validated dtype names), one line."""
    return "- " + " ".join(str(text).split())


def _check_phrase(check) -> str:
    """A passed check in a few words, e.g. "KL mean 0.0034 ≤ 0.02"."""
    if check.name in ("kl_mean", "kl_p99"):
        return f"{'KL mean' if check.name == 'kl_mean' else 'KL p99'} {fmt_sig(check.value)} ≤ {fmt_sig(check.limit)}"
    if check.name == "top1_agreement":
        return f"top-1 agreement {fmt_share(check.value)} ≥ {fmt_share(check.limit)}"
    if check.name == "new_degenerate_share":
        return check.detail
    if check.name == "degeneration_noninferiority":
        return f"degeneration excess upper bound {fmt_share(check.value)} < {fmt_share(check.limit)} ({check.detail})"
    if check.name == "kl_late_mean":
        return f"KL mean (late) {fmt_sig(check.value)} ≤ {fmt_sig(check.limit)}"
    if check.name == "task_noninferiority":
        return f"task recovery lower bound {fmt_share(check.value)} ≥ {fmt_share(check.limit)} ({check.detail})"
    if check.name == "task_recovery":
        return f"task recovery {fmt_share(check.value)} ({check.detail})"
    return f"{check.name} {fmt_sig(check.value)} (limit {fmt_sig(check.limit)})"


def _passed_lines(verdict: Verdict) -> list[str]:
    by_cell: dict[str, list[str]] = {}
    for check in verdict.checks:
        if check.passed:
            by_cell.setdefault(check.cell or "run", []).append(_check_phrase(check))
    return [_bullet(f"{cell}: {'; '.join(phrases)}") for cell, phrases in by_cell.items()]


def _thresholds_line(thresholds: dict) -> str:
    pairs = " ".join(f"{key}={value:g}" if isinstance(value, (int, float)) else f"{key}={value}"
                     for key, value in thresholds.items() if value is not None)
    return (f"Thresholds: `{pairs}` (change with `--threshold KEY=VALUE` or `--gate-config FILE.yaml`; "
            "see the README).")


def _noise_floor_line(floor: dict | None) -> str:
    if not floor:
        return (f"Noise floor: not measured (no `{BASELINE_KV}` cell scored twice or at two max_model_len values), "
                "so the thresholds apply unwidened.")
    sources = ", ".join(
        f"{s['cell']} re-scored in another batch (n {s['n']:,})" if s["kind"] == "noise_batch"
        else f"{s['cell']} vs {s['reference']} (n {s['n']:,})" for s in floor.get("source", []))
    return (f"Noise floor ({BASELINE_KV} vs itself, worst of: {sources}): KL mean {fmt_sig(floor.get('kl_mean'))}, "
            f"KL p99 {fmt_sig(floor.get('kl_p99'))}, top-1 disagreement {fmt_share(floor.get('top1_disagreement'))}. "
            "Budgets are max(threshold, noise_multiplier × floor).")


def _reason_line(reason) -> str:
    text = reason.message + (f" — **to decide:** {reason.decide}" if reason.decide else "")
    return _bullet(text)


def _cell_status_table(verdict: Verdict) -> str:
    rows = [{"cell": cell, "verdict": status} for cell, status in verdict.cells.items()]
    return table(pd.DataFrame(rows)) if rows else ""


def _profile_line(verdict: Verdict) -> str:
    profile = verdict.profile or {}
    budget = profile.get("budget") or {}
    if not budget:
        return ""
    return (f"Divergence budgets: **{profile.get('name')} profile** ({profile.get('why')}; {profile.get('calibration')}): "
            f"healthy KL mean ≤ {fmt_sig(budget.get('kl_mean_max'))}, late-position KL mean ≤ "
            f"{fmt_sig(budget.get('kl_late_max'))}, KL p99 ≤ {fmt_sig(budget.get('kl_p99_max'))}, top-1 ≥ "
            f"{fmt_share(budget.get('top1_agreement_min'))}; harm (FAIL) beyond KL mean {fmt_sig(budget.get('kl_mean_fail'))}, "
            f"late {fmt_sig(budget.get('kl_late_fail'))}, p99 {fmt_sig(budget.get('kl_p99_fail'))}, top-1 "
            f"{fmt_share(budget.get('top1_agreement_fail'))}.")


def _verdict_section(verdict: Verdict, evidence: dict, manifest: dict) -> str:
    model_dtype = (manifest.get("model") or {}).get("dtype") or "bf16"
    out = [f"## Verdict: **{verdict.status}**", "", f"**{headline(verdict, evidence, model_dtype)}**", ""]
    deploy = deploy_line(verdict, evidence)
    if deploy:
        out += [deploy, ""]
    deciding = [r for r in verdict.reasons if r.level == verdict.status]
    if verdict.status == PASS:
        out += ["Every required check passed:", "", *(_passed_lines(verdict) or ["- (no check was needed)"])]
    else:
        out += ["Why:", "", *(_reason_line(r) for r in deciding)]
    others = [r for r in verdict.reasons if r.level != verdict.status]
    if others:
        out += ["", "Also noted:", ""]
        out += [_reason_line(r) if r.level == NOTE else _bullet(f"({r.level.lower()}) {r.message}"
                                                               + (f" — to decide: {r.decide}" if r.decide else ""))
                for r in others]
    status_table = _cell_status_table(verdict)
    if status_table:
        out += ["", "Per tested cell:", "", status_table]
    out += ["", _profile_line(verdict), "", _thresholds_line(verdict.thresholds), "", _noise_floor_line(verdict.noise_floor)]
    return "\n".join(line for line in out if line is not None)


def _recommendation_section(evidence: dict, verdict: Verdict, manifest: dict) -> str:
    """The planning answer: per KV configuration, the longest context this budget starts, the
    concurrency it holds at the lengths run, and the quality verdict beside it. Needs the capacity
    model (runs from issue 10 on); older runs show no such table."""
    capacity = evidence.get("capacity_model")
    if not capacity:
        return ""
    limit = (manifest.get("model") or {}).get("max_position_embeddings")
    startup = {row["cell"]: row for row in evidence.get("startup") or []}
    rows = []
    for kv in dict.fromkeys(r["kv_cache_dtype"] for r in capacity):
        mine = sorted((r for r in capacity if r["kv_cache_dtype"] == kv), key=lambda r: r["max_model_len"])
        predicted = max((r["predicted_max_model_len"] or 0 for r in mine), default=0)
        started = [r["max_model_len"] for r in mine if r["started"]]
        if predicted and not started:
            longest = f"{fmt_int(predicted)} predicted, but it started at none of the lengths run"
        elif predicted:
            longest = fmt_int(min(predicted, limit) if limit else predicted) + (
                f" (the model's limit; the pool holds {fmt_int(predicted)})" if limit and predicted > limit else "")
        else:
            longest = f"≥ {fmt_int(max(started))} (largest that started; not predicted)" if started else "none of the lengths run"
        held = ", ".join(f"{fmt_int(r['max_model_len'])}: {fmt_float(startup.get(r['cell'], {}).get('max_concurrency'), 1)}×"
                         for r in mine if r["started"] and startup.get(r["cell"], {}).get("max_concurrency")) or "—"
        judged = ", ".join(f"{verdict.cells[r['cell']]} at {fmt_int(r['max_model_len'])}" for r in mine
                           if r["cell"] in verdict.cells)
        rows.append({"KV configuration": kv, "longest max_model_len on this budget": longest,
                     "requests of max_model_len it holds": held,
                     "quality verdict": "baseline" if kv == BASELINE_KV else (judged or "not judged")})
    return "\n".join(["## Recommendation", "",
                      "What each configuration buys on this run's KV budget, with the quality verdict beside it.", "",
                      table(pd.DataFrame(rows))])


def _run_section(manifest: dict, evidence: dict) -> str:
    versions = manifest.get("versions", {})
    hardware = manifest.get("hardware", {})
    options = manifest.get("options", {})
    stored = [cell for cell in (evidence.get("cells") or {}).values() if not cell.get("missing")]
    started = sum(1 for cell in stored if cell.get("started"))
    planned = len(manifest.get("cells", []))
    missing = planned - len(stored)
    lines = [
        "## Run",
        "",
        f"- **Command:** `{manifest.get('command', '').replace('`', '')}`",
        f"- **Model:** {escape_cell(manifest.get('model', {}).get('path'), None)} "
        f"({escape_cell(manifest.get('model', {}).get('source'), None)})",
        _prompt_format_line(manifest.get("prompt_format")),
        _kv_scales_line(manifest),
        f"- **Cells:** {planned} planned (KV dtype {', '.join(options.get('kv', []))} × max_model_len "
        f"{', '.join(str(x) for x in options.get('max_model_len', []))}); {started} started"
        + (f"; **{missing} have no result yet** (run interrupted?)" if missing > 0 else ""),
        f"- **Engine options:** KV budget "
        f"{fmt_int(options.get('kv_cache_memory_bytes')) + ' bytes' if options.get('kv_cache_memory_bytes') else 'vLLM default'}"
        f", gpu_memory_utilization {options.get('gpu_memory_utilization') or 'vLLM default'}"
        f", enforce_eager {options.get('enforce_eager')}, seed {options.get('seed')}, suite `{options.get('suite')}`"
        + (f", extra {escape_cell(options.get('engine_args'), None)}" if options.get("engine_args") else "")
        + (f" ({options['kv_budget_note']})" if options.get("kv_budget_note") else ""),
        f"- **Versions:** kveval {versions.get('kveval')}, vLLM {versions.get('vllm')} "
        f"({versions.get('vllm_distribution')}), torch {versions.get('torch')}, transformers {versions.get('transformers')}",
        f"- **Hardware:** {escape_cell(hardware.get('cpu'), None)}, {hardware.get('cores')} cores, "
        f"{hardware.get('memory_gib')} GiB"
        + (f"; GPUs: {escape_cell('; '.join(hardware.get('gpus')), None)}" if hardware.get("gpus") else "; no GPU")
        + (f"; CPU flags: {' '.join(hardware.get('cpu_flags', []))}" if not hardware.get("gpus") else ""),
        _remote_code_line(options),
        _rounds_line(manifest.get("task_rounds")),
        f"- **Created:** {manifest.get('created')}",
    ]
    return "\n".join(line for line in lines if line is not None)


def _rounds_line(record: dict | None) -> str | None:
    """What the rounds of more evidence did (run/rounds.py) and why they stopped; None without rounds."""
    if not record:
        return None
    rounds = record.get("rounds") or []
    done = []
    for entry in rounds:
        parts = []
        task_cells = [c for c in (entry.get("task_cells") if entry.get("task_cells") is not None
                                  else entry.get("cells") or [])[1:]]
        if task_cells:
            parts.append(f"task samples for {', '.join(task_cells)} (aiming at {entry.get('target')} paired)")
        probe_cells = (entry.get("probe_cells") or [])[1:]
        if probe_cells:
            parts.append(f"{(entry.get('probes') or {}).get('count')} new probes for {', '.join(probe_cells)}")
        done.append(f"round {entry['round']} at {entry['max_model_len']}: {'; '.join(parts)}")
    budget = (record.get("budget") or {}).get("text")
    head = f"- **Rounds of more evidence** (`--budget {budget}`): " if budget else "- **Rounds of more evidence:** "
    body = ("; ".join(done) + ". ") if done else "none. "
    return head + body + f"Stopped: {record.get('stopped') or 'still running'}."


def _remote_code_line(options: dict) -> str | None:
    """Said only when it was on: the checkpoint's own Python code ran inside the engines."""
    value = (options.get("engine_args") or {}).get("trust_remote_code")
    if value in (True, "true", "True", 1, "1"):
        return ("- **trust_remote_code: on** (--engine-arg trust_remote_code=true): the model's own Python code ran "
                "in every engine; kveval keeps it off unless asked")
    return None


def _kv_scales_line(manifest: dict) -> str | None:
    scales = manifest.get("kv_scales")
    if not scales:
        return None
    line = ("- **FP8 scales:** calibrated, from the checkpoint (" + str(scales.get("source")) + ")"
            if scales.get("calibrated") else "- **FP8 scales:** none in the checkpoint: vLLM runs the FP8 cache at "
                                             "scale 1.0 (values beyond ±448 saturate)")
    if manifest.get("baseline_engine_dtype"):
        line += (f"; vLLM would resolve `auto` to FP8 for this checkpoint, so the `auto` baseline cells run "
                 f"kv_cache_dtype={manifest['baseline_engine_dtype']} (the model dtype)")
    return line


def _startup_section(evidence: dict) -> str:
    out = ["## Start-up and KV pool", ""]
    if not evidence.get("startup"):
        return "\n".join(out + ["_No cell has a result yet._"])
    pools = pd.DataFrame(evidence.get("pools") or [])
    if not pools.empty:
        view = pd.DataFrame({
            "max_model_len": pools.max_model_len.map(fmt_int),
            "KV dtype": pools.kv_cache_dtype.fillna(""),
            f"{BASELINE_KV} pool tokens": pools.baseline_pool_tokens.map(fmt_int),
            "pool tokens": pools.pool_tokens.map(fmt_int),
            f"ratio vs {BASELINE_KV}": pools.ratio.map(lambda r: f"{r:.2f}×" if r is not None and not pd.isna(r) else ""),
            "did not start": pools.not_started,
        })
        out += [table(view), ""]
        fallback = pools[pools.fallback_ratio.notna()]
        for row in fallback.itertuples():
            out.append(f"- At max_model_len {row.max_model_len:,} a cell did not start, but its pool is known from "
                       f"{row.fallback_sources}: {BASELINE_KV} {fmt_int(row.baseline_fallback_tokens)} vs "
                       f"{row.kv_cache_dtype} {fmt_int(row.fallback_tokens)} tokens ({row.fallback_ratio:.2f}×).")
        if not fallback.empty:
            out.append("")
    startup = pd.DataFrame(evidence["startup"])
    view = pd.DataFrame({
        "cell": startup.cell,
        "started": startup.started.map(lambda s: "yes" if s else "**no**"),
        "start-up s": startup.startup_s.map(lambda v: fmt_float(v, 1)),
        "KV pool tokens": startup.kv_pool_tokens.map(fmt_int),
        "KV blocks": startup.num_blocks.map(fmt_int) if "num_blocks" in startup else "",
        "max concurrency": startup.max_concurrency.map(lambda v: fmt_float(v, 2) + "×" if fmt_float(v) else ""),
        "backend": startup.attention_backend.fillna(""),
        "reason": startup.reason.fillna(""),
        "vLLM estimated max length": startup.estimated_max_model_len.map(fmt_int),
    })
    out += [table(view)]
    out += _hybrid_pool_note(startup)
    failed = startup[~startup.started]
    if not failed.empty:
        out += ["", "Why cells did not start, in vLLM's own words:", ""]
        for (reason, message), group in failed.groupby(["reason", "message"], sort=False, dropna=False):
            advice = _REASON_ADVICE.get(reason)
            out.append(f"- **{', '.join(group.cell)}** — `{reason}`: {escape_cell(message, 600)}"
                       + (f" — {advice}" if advice else ""))
    crashed = startup[startup.crash.notna()]
    advice = startup["crash_advice"] if "crash_advice" in startup else pd.Series([None] * len(startup))
    for index, row in zip(crashed.index, crashed.itertuples()):
        what_now = advice.get(index) if isinstance(advice.get(index), str) else None
        out.append(f"- **{row.cell}** started, then its process died: {escape_cell(row.crash, 300)} "
                   "(phases finished before the crash are kept)" + (f". {escape_cell(what_now, 300)}." if what_now else ""))
    troubled = list(dict.fromkeys([*failed.cell, *crashed.cell]))
    if troubled:
        out += ["", LOG_LINE_START + ", ".join(f"[{name}]({RunDir.CELLS_DIR}/{name}.log)" for name in troubled)
                + " (vLLM's whole output; in the run directory)"]
    return "\n".join(out)


# What to do about the start-up failures whose cause lies outside the cell (a re-run redoes these).
_REASON_ADVICE = {
    "shared_device": "**another process used this device while vLLM measured its memory**: give kveval the "
                     "device alone (one run per GPU), then re-run the same command to redo these cells",
    "interrupted": "re-run the same command to redo these cells",
    "executor_lost": "the Ray task that ran the cell died (its node or worker went away): re-run the same command "
                     "to redo these cells",
}

LOG_LINE_START = "Engine logs of the cells that did not start or crashed: "


def _capacity_model_section(evidence: dict) -> str:
    """Predicted next to measured pools, so a pool that departs from the model's own arithmetic is seen."""
    rows = evidence.get("capacity_model")
    if not rows:
        return ""  # runs that did not record the model's KV layout
    predicted = [r for r in rows if r.get("predicted_tokens")]
    out = ["## KV capacity: predicted vs measured", ""]
    if not predicted:
        reasons = sorted({r["flag"] for r in rows if r.get("flag")})
        return "\n".join(out + [f"_Not predicted: {'; '.join(reasons) or 'no budget known'}._"])
    sources = sorted({r["budget_source"] for r in predicted if r.get("budget_source")})
    out += ["Each pool predicted from the model's KV layout and the budget: bytes per token = layers × KV heads × "
            "head dim × 2 (K and V) × bytes per element (1 for FP8; layers kept in the model dtype cost their full "
            "bytes), pool = ⌊budget ÷ (block size × bytes per token)⌋ × block size, as vLLM allocates whole blocks. "
            f"Budget: {', '.join(sources)}. A measured pool more than 3 % off the prediction is flagged.", ""]
    if any(r.get("layout_model") == "hybrid" for r in rows):
        out[-1:] = [" Sliding-window layers follow vLLM's hybrid allocator: layers form groups that share one block's "
                    "tensors; a request takes ⌈L ÷ block⌉ blocks in each full-attention group and "
                    "⌈min(window − 1 + batched tokens, L) ÷ block⌉ + 1 in each sliding group; the pool is "
                    "blocks ÷ blocks per request × L tokens, as vLLM reports it.", ""]
    view = pd.DataFrame({
        "cell": [r["cell"] for r in rows],
        "bytes per token": [fmt_int(r.get("bytes_per_token")) for r in rows],
        "budget": [_mib(r.get("budget_bytes")) for r in rows],
        "predicted tokens": [fmt_int(r.get("predicted_tokens")) for r in rows],
        "measured tokens": [fmt_int(r.get("measured_tokens")) if r.get("started") else "did not start" for r in rows],
        "Δ": [fmt_pct(100 * r["deviation"]) if r.get("deviation") is not None else "" for r in rows],
        "longest max_model_len it holds": [fmt_int(r.get("predicted_max_model_len")) for r in rows],
    })
    out.append(table(view))
    flagged = [r for r in rows if r.get("flag") and r.get("predicted_tokens")]
    if flagged:
        out += ["", *(f"- **{r['cell']}**: {fmt_pct(100 * r['deviation'])} — {r['flag']}." for r in flagged)]
    out += ["", *_pool_ratio_lines(rows),
            "", f"![KV pool per max_model_len, measured and predicted]({RunDir.CAPACITY_PLOT})"]
    return "\n".join(out)


def _pool_ratio_lines(rows: list[dict]) -> list[str]:
    """What the FP8 / baseline pool ratio is at each length, and why it is what it is."""
    pairs = [r for r in rows if r.get("measured_ratio") or r.get("predicted_ratio")]
    lines = []
    if pairs:
        lines += ["Pool against the baseline at the same max_model_len:", ""]
        for r in sorted(pairs, key=lambda r: (r["max_model_len"], r["cell"])):
            measured = (f"measured {r['measured_ratio']:.2f}×" if r.get("measured_ratio")
                        else "not measured (a cell did not start)")
            predicted = f"predicted {r['predicted_ratio']:.2f}×" if r.get("predicted_ratio") else "not predicted"
            lines.append(f"- {r['cell']}: {measured}, {predicted}")
        lines.append("")
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


def _mib(value) -> str:
    return "" if value is None else f"{value / 2 ** 20:,.1f} MiB"


def _prompt_format_line(fmt: dict | None) -> str | None:
    if not fmt:
        return None  # runs made before kveval recorded it
    if fmt.get("chat_template"):
        return "- **Prompts:** the model's chat template applied (token ids exactly as vLLM's chat path makes them)"
    bos = "adds" if fmt.get("adds_bos") else "does **not** add"
    return (f"- **Prompts:** plain text — the model has no chat template; its tokenizer {bos} a BOS token "
            f"({escape_cell(fmt.get('bos_token'), None) or 'none'}). A base model's answers to questions are often "
            "poor or loop on every cell alike; judge FP8 by the differences, not the answers.")


def _hybrid_pool_note(startup: pd.DataFrame) -> list[str]:
    """Same dtype, same blocks, different token figures: vLLM's hybrid-model token count moved."""
    started = startup[startup.started & startup.num_blocks.notna() & startup.kv_pool_tokens.notna()]
    for kv, group in started.groupby("kv_cache_dtype"):
        if group.num_blocks.nunique() == 1 and group.kv_pool_tokens.nunique() > 1:
            return ["", f"Note: the `{kv}` cells hold the same {fmt_int(group.num_blocks.iloc[0])} KV blocks at every "
                        "max_model_len, yet vLLM reports different token counts. For models with sliding-window "
                        "(hybrid) layers vLLM's token figure is max concurrency × max_model_len, not a memory size: "
                        "compare blocks, or the ratio at the same max_model_len."]
    return []


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
                         "detail": new.detail, "excerpt": new.excerpt.map(lambda t: _shorten(t or "", 160))})
    untrusted = ("workload", "prompt", "detail", "excerpt")
    if "baseline_excerpt" in new and new.baseline_excerpt.notna().any():  # the baseline's answer, beside it
        view[f"{BASELINE_KV}'s output"] = new.baseline_excerpt.map(lambda t: _shorten(t if isinstance(t, str) else "", 160))
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
             "output (start)": _shorten(row.get("text") or "", 240)} for row in samples.get("rows") or []]
    if not rows:
        return ""
    name = samples["prompt"]
    # A plain id reads best as code; anything else is escaped text (a code span cannot be escaped).
    shown = f"`{name}`" if re.fullmatch(r"[\w.:\-]+", str(name)) else escape_name(name)
    return "\n".join([f"## Sample outputs — {shown}", "",
                      table(pd.DataFrame(rows), untrusted=("output (start)",))])


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def _remedy_section(evidence: dict) -> str:
    remedy = evidence.get("remedy") or {}
    if not remedy.get("notes"):
        return ""
    out = ["## Remedy", "", f"Mode `--remedy {remedy.get('mode')}`: kveval keeps the layers whose K or V leave the FP8 "
                            "range in the model dtype (vLLM's kv_cache_dtype_skip_layers) and judges that "
                            "configuration with the same gate.", ""]
    out += [_bullet(note) for note in remedy["notes"]]
    pools = [row for row in evidence.get("pools") or [] if row.get("kv_cache_dtype")]
    if pools:
        rows = [{"max_model_len": row["max_model_len"], "KV configuration": row["kv_cache_dtype"],
                 "KV pool tokens": fmt_int(row.get("pool_tokens") or row.get("fallback_tokens")),
                 f"{BASELINE_KV} pool tokens": fmt_int(row.get("baseline_pool_tokens") or row.get("baseline_fallback_tokens")),
                 f"× {BASELINE_KV}": fmt_float(row.get("ratio") if row.get("ratio") is not None else row.get("fallback_ratio"), 2)}
                for row in pools]
        out += ["", "KV capacity per configuration (a cell that did not start shows vLLM's estimate):", "",
                table(pd.DataFrame(rows))]
    return "\n".join(out)

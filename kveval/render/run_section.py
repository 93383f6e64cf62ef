"""The review's run section: command, model, prompt format, FP8 scales, cells, engine options (and the
cells started otherwise), versions, hardware, trust_remote_code, rounds of more evidence. Pure: manifest
and evidence in, markdown out.
"""
from __future__ import annotations

import json

from kveval.analysis.thinking import count_thinking, thinking_line
from kveval.files import schema
from kveval.render.markdown import escape_cell, fmt_int


def run_section(manifest: schema.Manifest, evidence: schema.Evidence) -> str:
    versions, hardware, options = manifest.versions, manifest.hardware, manifest.options
    stored = [cell for cell in evidence.cells.values() if not cell.missing]
    started = sum(1 for cell in stored if cell.started)
    planned = len(manifest.cells)
    missing = planned - len(stored)
    lines = [
        "## Run",
        "",
        f"- **Command:** `{manifest.command.replace('`', '')}`",
        f"- **Model:** {escape_cell(manifest.model.path, None)} ({escape_cell(manifest.model.source, None)})"
        + (f"; weights quantized: {manifest.model.weights_quantization}, served as they are"
           if manifest.model.weights_quantization else ""),
        _encoder_line(manifest.model.encoder, options.engine_args),
        _dequantised_line(manifest.model.source),
        _prompt_format_line(manifest.prompt_format),
        _template_kwargs_line(options.chat_template_kwargs, manifest.prompt_format),
        _thinking_line(manifest, evidence),
        _kv_scales_line(manifest),
        f"- **Cells:** {planned} planned (KV dtype {', '.join(options.kv)} × max_model_len "
        f"{', '.join(str(x) for x in options.max_model_len)}); {started} started"
        + (f"; **{missing} have no result yet** (run interrupted?)" if missing > 0 else ""),
        f"- **Engine options:** KV budget "
        f"{fmt_int(options.kv_cache_memory_bytes) + ' bytes' if options.kv_cache_memory_bytes else 'vLLM default'}"
        f", gpu_memory_utilization {options.gpu_memory_utilization or 'vLLM default'}"
        f", enforce_eager {options.enforce_eager}, seed {options.seed}, suite `{options.suite}`"
        + (f", extra {escape_cell(options.engine_args, None)}" if options.engine_args else "")
        + (f" ({options.kv_budget_note})" if options.kv_budget_note else ""),
        _departing_engine_line(manifest),
        f"- **Versions:** kveval {versions.kveval}, vLLM {versions.vllm} "
        f"({versions.vllm_distribution}), torch {versions.torch}, transformers {versions.transformers}",
        f"- **Hardware:** {escape_cell(hardware.cpu, None)}, {hardware.cores} cores, "
        f"{hardware.memory_gib} GiB"
        + (f"; GPUs: {escape_cell('; '.join(hardware.gpus), None)}" if hardware.gpus else "; no GPU")
        + (f"; CPU flags: {' '.join(hardware.cpu_flags)}" if not hardware.gpus else ""),
        _devices_line(evidence),
        _remote_code_line(options),
        _rounds_line(manifest.task_rounds),
        f"- **Created:** {manifest.created}",
    ]
    return "\n".join(line for line in lines if line is not None)


def _devices_line(evidence: schema.Evidence) -> str | None:
    """Each cell's device, compute capability and attention backend as vLLM's platform layer named them
    (issue 38), one group per distinct set; None for cells from before, which did not ask."""
    groups: dict[tuple, list[str]] = {}
    for name, cell in evidence.cells.items():
        if cell.platform is None:
            continue
        key = (cell.platform, cell.device, cell.capability, cell.backend, cell.calibrated)
        groups.setdefault(key, []).append(name)
    if not groups:
        return None
    parts = []
    for (platform, device, capability, backend, calibrated), cells in groups.items():
        on = f"{escape_cell(device, None) if device else 'unnamed device'} ({platform}"
        on += f" {capability})" if capability else ")"
        parts.append(f"{', '.join(cells)}: {on}, {backend or 'backend unknown'}"
                     + (", **budget uncalibrated**" if calibrated is False else ""))
    return "- **Devices** (vLLM's platform layer): " + "; ".join(parts)


def _engine_departures(engine: schema.PlannedEngine, options: schema.Options) -> tuple[str, ...]:
    """The settings a cell was started with that the engine options line does not say (its KV dtype, kept
    layers and max_model_len are the cell's name)."""
    parts = []
    if engine.kv_cache_memory_bytes != options.kv_cache_memory_bytes:
        budget = engine.kv_cache_memory_bytes
        parts.append(f"KV budget {fmt_int(budget) + ' bytes' if budget else 'vLLM default'}")
    if engine.gpu_memory_utilization != options.gpu_memory_utilization:
        parts.append(f"gpu_memory_utilization {engine.gpu_memory_utilization or 'vLLM default'}")
    if engine.enforce_eager != options.enforce_eager:
        parts.append(f"enforce_eager {engine.enforce_eager}")
    if engine.seed != options.seed:
        parts.append(f"seed {engine.seed}")
    if engine.extra != options.engine_args:
        parts.append(f"extra {escape_cell(engine.extra, None)}")
    return tuple(parts)


def _departing_engine_line(manifest: schema.Manifest) -> str | None:
    """One line for the cells started with engine settings other than the options line's (a quality
    reference's own KV budget), one group per distinct set; None when every cell ran as the options say
    or the manifest predates per-cell settings (issue 19)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for cell in manifest.cells:
        departures = _engine_departures(cell.engine, manifest.options) if cell.engine is not None else ()
        if departures:
            groups.setdefault(departures, []).append(cell.id)
    if not groups:
        return None
    return ("- **Cells started with other engine settings** (manifest `cells[].engine`): "
            + "; ".join(f"{', '.join(cells)}: {', '.join(parts)}" for parts, cells in groups.items()))


def _rounds_line(record: schema.TaskRounds | None) -> str | None:
    """What the rounds of more evidence did (run/rounds.py) and why they stopped; None without rounds."""
    if record is None:
        return None
    done = []
    for entry in record.rounds:
        parts = []
        task_cells = (entry.task_cells if entry.task_cells is not None else entry.cells)[1:]
        if task_cells:
            parts.append(f"task samples for {', '.join(task_cells)} (aiming at {entry.target} paired)")
        probe_cells = (entry.probe_cells or [])[1:]
        if probe_cells:
            parts.append(f"{entry.probes.count if entry.probes else None} new probes for {', '.join(probe_cells)}")
        scoring_cells = (entry.scoring_cells or [])[1:]
        if scoring_cells:
            parts.append(f"new documents scored for {', '.join(scoring_cells)} (aiming at {entry.document_target} "
                         "scored sequences)")
        done.append(f"round {entry.round} at {entry.max_model_len}: {'; '.join(parts)}")
    budget = record.budget.get("text")   # inputs/budget.Budget.to_dict()
    head = f"- **Rounds of more evidence** (`--budget {budget}`): " if budget else "- **Rounds of more evidence:** "
    body = ("; ".join(done) + ". ") if done else "none. "
    return head + body + f"Stopped: {record.stopped or 'still running'}."


def _remote_code_line(options: schema.Options) -> str | None:
    """Said only when it was on: the checkpoint's own Python code ran inside the engines."""
    value = options.engine_args.get("trust_remote_code")   # the user's engine args, as given
    if value in (True, "true", "True", 1, "1"):
        return ("- **trust_remote_code: on** (--engine-arg trust_remote_code=true): the model's own Python code ran "
                "in every engine; kveval keeps it off unless asked")
    return None


def _kv_scales_line(manifest: schema.Manifest) -> str | None:
    scales = manifest.kv_scales
    if scales is None:
        return None
    line = ("- **FP8 scales:** calibrated, from the checkpoint (" + str(scales.source) + ")"
            if scales.calibrated else "- **FP8 scales:** none in the checkpoint: vLLM runs the FP8 cache at "
                                             "scale 1.0 (values beyond ±448 saturate)")
    if manifest.baseline_engine_dtype:
        line += (f"; vLLM would resolve `auto` to FP8 for this checkpoint, so the `auto` baseline cells run "
                 f"kv_cache_dtype={manifest.baseline_engine_dtype} (the model dtype)")
    return line


def _template_kwargs_line(kwargs: dict | None, fmt: schema.PromptFormat) -> str | None:
    """Said only when given: the arguments every chat rendering got (a thinking template's enable_thinking)."""
    if not kwargs:
        return None
    shown = json.dumps(kwargs, ensure_ascii=False).replace("`", "")   # one line: JSON escapes its newlines
    return (f"- **Chat-template arguments:** `{shown}` "
            "(--chat-template-kwargs)" + ("" if fmt.chat_template else ": no effect, the model has no chat template"))


def _thinking_line(manifest: schema.Manifest, evidence: schema.Evidence) -> str | None:
    """Said only when most task answers came back empty or inside <think> (analysis/thinking.py)."""
    if not isinstance(evidence.tasks, schema.TaskEvidence):   # {}: no cell ran tasks
        return None
    fmt = manifest.prompt_format
    counted = count_thinking((row.response for row in evidence.tasks.sample_rows if row.accepted),
                             bool(fmt.opens_thinking))
    given = bool(fmt.thinking_switch and fmt.thinking_switch in (manifest.options.chat_template_kwargs or {}))
    return thinking_line(counted, fmt.thinking_switch, given)


def _prompt_format_line(fmt: schema.PromptFormat) -> str | None:
    if fmt.chat_template:
        return "- **Prompts:** the model's chat template applied (token ids exactly as vLLM's chat path makes them)"
    bos = "adds" if fmt.adds_bos else "does **not** add"
    return (f"- **Prompts:** plain text — the model has no chat template; its tokenizer {bos} a BOS token "
            f"({escape_cell(fmt.bos_token, None) or 'none'}). A base model's answers to questions are often "
            "poor or loop on every cell alike; judge FP8 by the differences, not the answers.")


def _encoder_line(encoder: schema.EncoderEntry | None, engine_args: dict) -> str | None:
    """A multimodal checkpoint (inputs/multimodal.py): the text model runs; the encoder vLLM loads counts in fixed
    memory, unless --engine-arg language_model_only=true left it out."""
    if encoder is None:
        return None
    modalities = " and ".join(encoder.modalities)
    head = (f"- **Encoder:** multimodal checkpoint ({escape_cell(encoder.architecture or 'unnamed architecture', None)}): "
            "kveval runs its text model (text prompts; K/V bytes per token from its text config); ")
    if engine_args.get("language_model_only") in (True, "true", "True", 1):
        return head + f"`language_model_only` kept vLLM from loading the {modalities} encoder"
    size = (f" ({encoder.weight_bytes / 2 ** 20:,.1f} MiB of encoder and projector weights)" if encoder.weight_bytes
            else "")
    return (head + f"vLLM still loads the {modalities} encoder{size} and profiles it at start-up, so it counts in "
            f"fixed memory, as in `vllm serve` with {modalities} inputs allowed; `--engine-arg language_model_only=true` "
            "leaves it out")


def _dequantised_line(source: str) -> str | None:
    """A GGUF model (the embedded default or --model FILE.gguf, inputs/models.py) runs as the bf16 copy kveval made:
    the verdict is on those weights, not on the GGUF's own quantized ones."""
    if "GGUF" not in source.upper() or "dequantised" not in source:
        return None
    return ("- **Weights served:** bf16, dequantised from the GGUF by kveval: this verdict is on those weights, not on "
            "the GGUF's own quantized ones (vLLM serves GGUF files only through its vllm-gguf-plugin since 0.24, whose "
            "kernels need CUDA; kveval does not use it)")

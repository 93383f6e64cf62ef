"""--baseline-from RUN_DIR (issue 39): the `auto` cells of an earlier kveval run as this run's baseline.

The field case: on a 12 GB card `max_model_len=98304` starts only with FP8, so there is no `auto` engine
there to judge FP8 against. A baseline run made where `auto` fits (a larger GPU, a CPU: `kveval baseline`)
has the generations, scoring logprobs (with its own auto-vs-auto noise re-score) and task answers this
run's FP8 cells are compared with. Before any engine starts the two runs must be shown comparable: the
same weights, tokenizer and chat template, the same prompts, scoring documents and task samples (by
content), the same seed and sampling settings, and an `auto` cell that started at every length asked.
Whatever differs is refused in one line. The cells are copied into this run (the source directory is
only read) and recorded in the manifest's `imported_baseline`: quality only, never a capacity, speed or
time figure of this run (evidence.py), and the gate widens the divergence budget when the baseline was
measured on another machine (gate/evaluate.py, docs/statistics.md).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Sequence

from kveval.defaults import BASELINE_KV
from kveval.errors import KvevalError
from kveval.evidence import platform_profile
from kveval.files import schema
from kveval.files.rundir import RunDir, StoreError, cell_id, read_json
from kveval.inputs.workloads import ChatTemplateTokenizer

QUALITY_PHASES = ("generation", "scoring", "tasks")   # what a baseline is compared on
# Engine arguments that change what the model computes (not how fast): they must match.
QUALITY_ENGINE_ARGS = ("dtype", "tokenizer", "revision", "tokenizer_revision", "quantization", "hf_overrides")


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def fingerprints(tokenizer) -> dict[str, str | None]:
    """The tokenizer (vocabulary and special tokens) and the chat template, hashed: the manifest keeps them
    so that a later run can tell a baseline made with another tokenizer or template."""
    inner = tokenizer.tokenizer if isinstance(tokenizer, ChatTemplateTokenizer) else tokenizer
    try:
        vocab = sorted(inner.get_vocab().items())
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary: the prompts' content still decides
        vocab = None
    special = [getattr(inner, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")]
    template = getattr(inner, "chat_template", None)
    return {"tokenizer": _sha([vocab, special]) if vocab is not None else None,
            "chat_template": _sha(template) if template else None}


def load_source(path: str | Path) -> tuple[RunDir, schema.Manifest, dict[str, schema.CellResult]]:
    """The baseline run, read (never written); a KvevalError in one line when it is not a usable run."""
    source = RunDir(Path(path))
    if not source.manifest_path.is_file():
        raise KvevalError(f"--baseline-from {path}: no kveval run there (no manifest.json)")
    try:
        manifest = source.manifest()
        cells = source.cell_results(manifest)
    except StoreError as error:
        raise KvevalError(f"--baseline-from {path}: {error}") from None
    return source, manifest, cells


def _weights(model: dict) -> Any:
    weights = (model.get("weights") or {}).get("sha256")
    return weights or [model.get("name"), model.get("revision")]


def _by_id(items: list[dict]) -> dict[str, str]:
    return {item["id"]: _sha(item) for item in items}


def _changed(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    return [key for key, digest in ours.items() if theirs.get(key) != digest]


def _named(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def input_differences(source: RunDir, theirs: schema.Manifest, cells: dict[str, schema.CellResult], manifest: dict,
                      prompts: list[dict], documents: list[dict]) -> list[str]:
    """Each way the baseline run differs from this one in what its `auto` cells measured, in words; [] when
    comparable. `manifest`, `prompts`, `documents`: this run's, before anything is written."""
    out = []
    mine = manifest["model"]
    their_model = schema.dump(theirs.model)
    if _weights(mine) != _weights(their_model):
        out.append(f"weights differ ({their_model.get('name')} there, {mine.get('name')} here)")
    if mine.get("dtype") != their_model.get("dtype"):
        out.append(f"model dtype differs ({their_model.get('dtype')} there, {mine.get('dtype')} here)")
    options, their_options = manifest["options"], schema.dump(theirs.options)
    engine = {k: options["engine_args"].get(k) for k in QUALITY_ENGINE_ARGS}
    their_engine = {k: their_options["engine_args"].get(k) for k in QUALITY_ENGINE_ARGS}
    if engine != their_engine:
        keys = [k for k in QUALITY_ENGINE_ARGS if engine[k] != their_engine[k]]
        out.append(f"engine arguments differ ({', '.join(f'{k}={their_engine[k]!r} there, {engine[k]!r} here' for k in keys)})")
    prints, their_prints = manifest.get("fingerprints") or {}, theirs.fingerprints or {}
    if prints.get("tokenizer") and their_prints.get("tokenizer") and prints["tokenizer"] != their_prints["tokenizer"]:
        out.append("tokenizer differs (another vocabulary or special tokens)")
    template_there = [their_prints.get("chat_template"), schema.dump(theirs.prompt_format).get("chat_template"),
                      their_options.get("chat_template_kwargs")]
    template_here = [prints.get("chat_template"), manifest["prompt_format"].get("chat_template"),
                     options.get("chat_template_kwargs")]
    if their_prints.get("chat_template") is None and "fingerprints" not in schema.dump(theirs):
        template_there[0] = template_here[0]   # a baseline from before fingerprints: the prompts' content decides
    if template_there != template_here:
        out.append("chat template differs (its text or --chat-template-kwargs)")
    if options["seed"] != their_options["seed"]:
        out.append(f"seed differs ({their_options['seed']} there, {options['seed']} here)")
    tasks_here = "tasks" in options["phases"] and bool(options.get("tasks"))
    sampling = _sampling(options, tasks_here)
    their_sampling = _sampling(their_options, tasks_here)
    if tasks_here and set(options["tasks"]) <= set(their_options.get("tasks") or []):
        sampling["tasks"] = their_sampling["tasks"]   # a subset of the baseline's tasks is comparable
    if sampling != their_sampling:
        keys = [k for k in sampling if sampling[k] != their_sampling.get(k)]
        out.append(f"sampling settings differ ({', '.join(f'{k} {their_sampling.get(k)!r} there, {sampling[k]!r} here' for k in keys)})")
    try:
        their_prompts = source.load_workloads(theirs)
        their_documents = read_json(source.scoring_path) if source.scoring_path.is_file() else []
    except (StoreError, OSError, ValueError) as error:
        raise KvevalError(f"--baseline-from {source.path}: its prompts cannot be read ({error})") from None
    changed = _changed(_by_id(prompts), _by_id(their_prompts))
    if changed:
        out.append(f"prompts differ by content ({_named(changed)})")
    changed = _changed(_by_id(documents), _by_id(their_documents))
    if changed:
        out.append(f"scoring documents differ by content ({_named(changed)})")
    missing = [p for p in options["phases"] if p in QUALITY_PHASES and p not in their_options["phases"]]
    if missing:
        out.append(f"phases {', '.join(missing)} did not run there")
    lengths = [int(x) for x in options["max_model_len"]]
    absent = [n for n in lengths if not (cells.get(cell_id(BASELINE_KV, n)) and cells[cell_id(BASELINE_KV, n)].started)]
    if absent:
        out.append(f"no started {BASELINE_KV} cell there at max_model_len {', '.join(str(n) for n in absent)} "
                   f"(there: {', '.join(str(n) for n in their_options['max_model_len'])})")
    asked = [p for p in options["phases"] if p in QUALITY_PHASES]
    for n in lengths:
        facts = cells.get(cell_id(BASELINE_KV, n))
        gaps = unusable_phases(facts, asked) if facts is not None and facts.started else []
        if gaps:
            out.append(f"{cell_id(BASELINE_KV, n)} there has no complete {', '.join(gaps)}")
    return out


def unusable_phases(facts: schema.CellResult, phases: list[str]) -> list[str]:
    """The quality phases a baseline cell lacks (not recorded, or recorded with an error), the crash that
    lost them named when the cell died (a timeout, the child killed)."""
    gaps = [phase for phase in phases
            if getattr(facts.phases, phase) is None or getattr(facts.phases, phase).error is not None]
    if gaps and facts.crash is not None:
        return [f"{', '.join(gaps)} (the cell crashed: {facts.crash.message})"]
    return gaps


def baseline_gaps(run: RunDir) -> list[str]:
    """`kveval baseline`'s check of its own run: one line per `auto` cell that cannot serve as a baseline."""
    manifest = run.manifest()
    cells = run.cell_results(manifest)
    asked = [p for p in manifest.options.phases if p in QUALITY_PHASES]
    out = []
    for planned in manifest.cells:
        facts = cells.get(planned.id)
        if facts is None or not facts.started:
            out.append(f"{planned.id} did not start")
            continue
        gaps = unusable_phases(facts, asked)
        if gaps:
            out.append(f"{planned.id} has no complete {', '.join(gaps)}")
    return out


def _sampling(options: dict, tasks: bool) -> dict:
    """What decides the baseline's outputs and scores besides the inputs: the suite, greedy generation's token
    budgets (in the prompts' content), the scored top-k, and the task selection where this run asks tasks."""
    phase = options.get("phase_options") or {}
    out = {"suite": options.get("suite"), "scoring top_k": (phase.get("scoring") or {}).get("top_k")}
    if tasks:
        out.update({"tasks": options.get("tasks"), "task limit": options.get("limit"),
                    "task samples": options.get("samples_per_point"), "task lengths": options.get("lengths"),
                    "task depths": options.get("depths")})
    return out


def task_data_differences(source: RunDir, theirs: schema.Manifest, run: RunDir, task_data: dict,
                          lengths: Sequence[int], tasks_asked: bool) -> list[str]:
    """Task samples that differ by content between the two runs, at the lengths asked ([] when the same)."""
    if not tasks_asked:
        return []
    their_data = schema.dump(theirs.task_data)
    differ = []
    for length in sorted(int(x) for x in lengths):
        key = str(length)
        for task, entry in (task_data.get("files", {}).get(key) or {}).items():
            theirs_entry = (their_data.get("files", {}).get(key) or {}).get(task)
            if not entry.get("file"):
                continue
            mine = run.task_data_path(task_data["data_dirs"][key]) / entry["file"]
            there = (source.task_data_path(their_data["data_dirs"][key]) / theirs_entry["file"]
                     if theirs_entry and theirs_entry.get("file") and key in their_data.get("data_dirs", {}) else None)
            if there is None or not there.is_file() or _file_sha(there) != _file_sha(mine):
                differ.append(f"{task}@{length}")
    return [f"task samples differ by content ({_named(differ)})"] if differ else []


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refuse(path: str | Path, differences: list[str]) -> None:
    """One line naming whatever differs (no engine has started)."""
    if differences:
        raise KvevalError(f"--baseline-from {path}: not comparable with this run: {'; '.join(differences)}")


def imported_ids(lengths: Sequence[int]) -> list[str]:
    return [cell_id(BASELINE_KV, int(n)) for n in sorted(dict.fromkeys(int(x) for x in lengths))]


def _host(hardware: dict) -> str:
    return f"{hardware.get('cpu') or 'unknown CPU'} ({hardware.get('machine')})"


def _gpu(hardware: dict) -> str | None:
    gpus = hardware.get("gpus") or []
    return gpus[0].split(",")[0].strip() if gpus else None


def _vllm(versions: dict) -> str | None:
    if not versions.get("vllm"):
        return None
    return versions["vllm"] + (f" ({versions['vllm_distribution']})" if versions.get("vllm_distribution") else "")


def import_record(path: str | Path, theirs: schema.Manifest, cells: dict[str, schema.CellResult], ids: list[str],
                  manifest: dict) -> dict:
    """The manifest's `imported_baseline`: where the cells were measured and whether that is another machine."""
    hardware, versions = schema.dump(theirs.hardware), schema.dump(theirs.versions)
    backends = sorted({cells[i].info.attention_backend for i in ids if cells[i].info.attention_backend})
    origin = {"host": _host(hardware), "gpu": _gpu(hardware), "vllm": _vllm(versions),
              "attention_backend": ", ".join(backends) or None,
              "profile": platform_profile(theirs, {i: cells[i] for i in ids})["profile"]}
    here = {"host": _host(manifest["hardware"]), "gpu": _gpu(manifest["hardware"]),
            "vllm": _vllm(manifest["versions"])}
    differences = [f"{name} {origin[key] or 'none'} there, {here[key] or 'none'} here"
                   for key, name in (("host", "host"), ("gpu", "GPU"), ("vllm", "vLLM")) if origin[key] != here[key]]
    return {"source": str(path), "created": theirs.created, "cells": ids, "origin": origin,
            "cross_machine": bool(differences), **({"differences": differences} if differences else {})}


def copy_cells(source: RunDir, run: RunDir, ids: list[str]) -> None:
    """The imported cells' files, copied into this run (the source is only read)."""
    run.cells_dir.mkdir(parents=True, exist_ok=True)
    for cell in ids:
        shutil.copyfile(source.cell_path(cell), run.cell_path(cell))

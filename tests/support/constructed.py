"""Constructed run directories for tests: stored facts with known figures, no engine.

A cell's scoring phase holds DOCUMENTS (3) documents, doc:300, doc:301, ..., each scored at positions
1..n with a fixed top-5 distribution per position (the gate's divergence intervals count scored
sequences: one document gives none); `shape` picks the candidate's distribution:
  "same"    identical to the reference (KL 0),
  "healthy" 0.01 of mass moved from the first to the second token (KL ≈ 3.3e-4),
  "harmed"  the reference's top token nearly dropped, the second promoted (KL ≈ 1.52, top-1 never agrees).
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from kveval.files import schema
from kveval.files.rundir import RunDir, write_json_atomic

# A real manifest (the CPU demo's, as this kveval reads it) is the template: constructed runs are valid
# run directories.
TEMPLATE_MANIFEST = schema.upgrade("manifest", json.loads(
    (Path(__file__).resolve().parents[2] / "reports/cpu-demo/manifest.json").read_text()))

TOP_K = 5
DOCUMENTS = 3   # scored documents per cell: the gate's divergence interval needs at least 2
REFERENCE_P = [0.6, 0.2, 0.1, 0.05, 0.03]
SHAPES = {
    "same": REFERENCE_P,
    "healthy": [0.59, 0.21, 0.1, 0.05, 0.03],
    "harmed": [0.03, 0.6, 0.1, 0.05, 0.2],
}


def expected_kl(shape: str) -> float:
    """KL over the 5 listed tokens plus the rest bucket (0.02 on both sides: contributes 0)."""
    return sum(p * math.log(p / q) for p, q in zip(REFERENCE_P, SHAPES[shape]))


def scored_document(n: int, shape: str = "same", doc_id: str = "doc:300") -> dict:
    """One accepted document sequence: tokens 1..n scored; top-5 tokens at position j are 1000+j .. 1004+j."""
    token_ids = [7] + [1000 + j for j in range(1, n + 1)]
    positions = []
    for j in range(1, n + 1):
        tokens = [1000 + j + i for i in range(TOP_K)]
        probs = SHAPES[shape]
        positions.append({"token": token_ids[j], "logprob": math.log(probs[0]),
                          "top": [[t, math.log(p)] for t, p in zip(tokens, probs)]})
    return {"id": doc_id, "kind": "document", "token_ids": token_ids, "scored_from": 1, "accepted": True,
            "rejection": None, "error": None, "positions": positions}


def scored_sequences(n: int, shape: str = "same", documents: int = DOCUMENTS) -> list[dict]:
    """`documents` scored documents doc:300, doc:301, ..., each as `scored_document(n, shape)`: documents × n
    positions in all. Every document has the same figures, so a clustered figure's standard error is 0."""
    return [scored_document(n, shape, f"doc:{300 + i}") for i in range(documents)]


def scoring_phase(n: int, shape: str, noise_shape: str | None = None, documents: int = DOCUMENTS) -> dict:
    """A scoring phase of `documents` documents of n scored positions each (documents × n in all)."""
    phase = {"top_k": TOP_K, "reference_cell": "auto-1024", "sequences": scored_sequences(n, shape, documents)}
    if noise_shape is not None:
        phase["noise"] = {"method": "same sequences re-scored in one batch",
                          "sequences": scored_sequences(n, noise_shape, documents)}
    return phase


def record(prompt_id: str, token_ids: list[int], text: str, finish: str = "stop") -> dict:
    return {"prompt_id": prompt_id, "workload": prompt_id.rsplit("-", 1)[0], "accepted": True, "rejection": None,
            "error": None, "text": text, "token_ids": list(token_ids), "finish_reason": finish,
            "output_tokens": len(token_ids)}


PROBES = 60   # degeneration probes: 0 vs 0 new degenerate of 60 is shown under the 5 % margin (upper bound 4.3 %)


def probe_workloads(count: int = PROBES) -> list[dict]:
    """`count` degeneration probes (workload "probe", kind "probe", as the suites plan them): without them a
    constructed run's handful of prompts can never show degeneration non-inferior (0 of 3: upper bound 47 %)."""
    return [{"id": f"probe-{i}", "workload": "probe", "kind": "probe", "token_ids": [1, 5, 10 + i], "max_tokens": 32}
            for i in range(count)]


def probe_records(count: int = PROBES) -> list[dict]:
    """Healthy answers to `probe_workloads(count)`, the same in every cell: short, distinct, stopped."""
    return [record(f"probe-{i}", [600 + i, 700 + i, 800 + i], f"Answer number {i} is short.") for i in range(count)]


def rejected(prompt_id: str, message: str = "VLLMValidationError: This model's maximum context length is 1024 tokens."):
    return {"prompt_id": prompt_id, "workload": prompt_id.rsplit("-", 1)[0], "accepted": False, "rejection": message,
            "error": None}


def speed_phase(ttft: float, decode: float) -> dict:
    return {"concurrency": 1, "warmup_runs": 0, "measured_runs": 1, "workloads": [{"workload": "short_256", "prompt_tokens": 3, "max_tokens": 32, "runs": [{}],
                           "ttft_s": {"median": ttft, "min": ttft, "max": ttft, "n": 1},
                           "decode_tok_s": {"median": decode, "min": decode, "max": decode, "n": 1},
                           "throughput_tok_s": {"median": decode, "n": 1}}]}


def started_cell(kv: str, length: int, pool: int, records: list[dict], scoring: dict | None = None,
                 ttft: float = 0.1, decode: float = 50.0) -> dict:
    phases = {"generation": {"sampling": {"temperature": 0.0}, "records": records}, "speed": speed_phase(ttft, decode)}
    if scoring is not None:
        phases["scoring"] = scoring
    return {"schema_version": schema.CELL_VERSION, "cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length,
            "started": True, "complete": True, "startup_seconds": 7.0,
            "capacity": {"kv_pool_tokens": pool, "kv_pool_tokens_source": "engine", "max_concurrency": pool / length,
                         "num_blocks": None, "block_size": None, "cache_dtype": kv},
            "info": {"attention_backend": "CPU_ATTN", "platform": "cpu"}, "phases": phases,
            "logged_capacity": {"kv_pool_tokens": None, "max_concurrency": None}}


def failed_cell(kv: str, length: int, reason: str = "unsupported_dtype",
                message: str = "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.") -> dict:
    return {"schema_version": schema.CELL_VERSION, "cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length,
            "started": False, "complete": True,
            "failure": {"reason": reason, "message": message, "estimated_max_model_len": None, "backend": None},
            "logged_capacity": {"kv_pool_tokens": 2 * 1792, "max_concurrency": None}, "phases": {},
            "info": {"attention_backend": None}}


# What a stored cell file always holds (schema.CellResult), for tests that build only the parts they test.
_PHASE_KEYS = {
    "generation": {"sampling": {}, "records": []},
    "scoring": {"top_k": TOP_K, "sequences": []},
    "tasks": {"tasks": [], "data_dir": "", "lm_eval_results": {}, "task_errors": {}, "samples": []},
    "speed": {"concurrency": 1, "warmup_runs": 0, "measured_runs": 1, "workloads": []},
    "throughput": {"prompt_tokens": 0, "max_tokens": 0, "levels": [], "runs": []},
}


def complete_cell(facts: dict) -> dict:
    """`facts` (changed in place, and returned) with every key a stored cell file must hold filled in
    where the test left it out: the analyses validate the cells they are given (schema.CellResult).
    The test's own values are kept; a cell without `started` did not start, as the analyses read it."""
    kv, length = facts.get("kv_spec", "auto"), facts.get("max_model_len", 1024)
    facts.setdefault("schema_version", schema.CELL_VERSION)
    facts.setdefault("cell", f"{kv}-{length}")
    facts.setdefault("kv_spec", kv)
    facts.setdefault("max_model_len", length)
    facts.setdefault("started", False)
    facts.setdefault("complete", True)
    facts.setdefault("phases", {})
    facts.setdefault("info", {"attention_backend": None})
    facts.setdefault("logged_capacity", {"kv_pool_tokens": None, "max_concurrency": None})
    if facts["started"] or facts.get("capacity") is not None:
        facts["capacity"] = {"kv_pool_tokens": None, "kv_pool_tokens_source": None, "max_concurrency": None,
                             "num_blocks": None, "block_size": None, "cache_dtype": kv, **(facts.get("capacity") or {})}
    if not facts["started"]:
        facts.setdefault("failure", {"reason": "other", "message": "did not start", "estimated_max_model_len": None,
                                     "backend": None})
    if facts.get("engine_settings") is not None:
        facts["engine_settings"] = {"model": "/m", "kv_cache_dtype": kv, "max_model_len": length, "seed": 0,
                                    **facts["engine_settings"]}
    for name, phase in facts["phases"].items():
        if isinstance(phase, dict) and phase.get("error") is None:
            for key, value in _PHASE_KEYS.get(name, {}).items():
                phase.setdefault(key, copy.deepcopy(value))
    return facts


def complete_cells(cells: dict[str, dict]) -> dict[str, dict]:
    """`complete_cell` on every cell (in place); the same dict back."""
    for facts in cells.values():
        complete_cell(facts)
    return cells


def manifest_for(cells: dict[str, dict]) -> dict:
    planned = [{"id": name, "kv_spec": c["kv_spec"], "max_model_len": c["max_model_len"]}
               for name, c in cells.items()]
    return planned_manifest(planned)


def planned_manifest(planned: list[dict], **changes) -> dict:
    """A valid manifest for these planned cells (id, kv_spec, max_model_len), no tasks."""
    manifest = copy.deepcopy(TEMPLATE_MANIFEST)
    kvs = list(dict.fromkeys(c["kv_spec"] for c in planned))
    lengths = sorted({c["max_model_len"] for c in planned})
    manifest.update(command="kveval compare --kv fp8 auto", cells=planned)
    manifest["model"].update(name="m", path="/m")
    manifest["model"].pop("kv_layout", None)  # no capacity prediction unless a test asks for one
    manifest["options"].pop("kv_budget_note", None)
    manifest["options"].update(kv=kvs, max_model_len=lengths, suite="quick", tasks=[],
                               phases=["generation", "scoring", "speed"],
                               phase_options={"scoring": {"top_k": TOP_K}})
    manifest["task_data"] = {"data_dirs": {}, "files": {}, "skipped": {}}
    manifest.update(changes)
    return manifest


def write_run(path, workloads: list[dict], cells: dict[str, dict]) -> RunDir:
    store = RunDir(path)
    write_json_atomic(store.manifest_path, manifest_for(cells))
    write_json_atomic(store.workloads_path, workloads)
    for name, facts in cells.items():
        write_json_atomic(store.cell_path(name), facts)
    return store

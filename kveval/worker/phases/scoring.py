"""Teacher-forced scoring: every cell scores the SAME token sequences with prompt logprobs.

Because the history is identical in every cell, differences in the next-token distributions are
due to the cell (its KV dtype), not to greedy outputs that drifted apart. Sequences:

- `cont:<prompt>` — a prompt followed by the reference continuation: the greedy output of the
  run's reference `auto` cell (the first one that started; cells run shortest length first, `auto`
  first, so it has finished before any other cell needs it). Only positions of the continuation
  are scored.
- `doc:<n>` — plain corpus documents sized to each max_model_len of the run (scoring.json in the
  run directory); a cell scores those that fit it.

`auto` cells score everything a second time in one batch (a different batch composition): the
difference is the noise floor — what "no real change" looks like on this platform.
"""
from __future__ import annotations

from kveval.defaults import BASELINE_KV
from kveval.files.rundir import read_json


def _reference_outputs(cell) -> dict[str, list[int]]:
    """prompt_id -> greedy output token ids of the reference auto cell (maybe this very cell)."""
    candidates = []
    if cell.kv_spec == BASELINE_KV:
        candidates.append(cell.facts)
    if cell.run_dir is not None:
        for planned in read_json(cell.run_dir.manifest_path).get("cells", []):
            if planned["kv_cache_dtype"] != BASELINE_KV:
                continue
            earlier = cell.run_dir.load_cell(planned["id"], validate=False)
            if earlier is not None:
                candidates.append(earlier)
    # The reference is the first auto cell in run order that generated: the same one for all cells.
    ordered = sorted((c for c in candidates if c.get("started")), key=lambda c: c.get("max_model_len", 0))
    for facts in ordered:
        records = ((facts.get("phases") or {}).get("generation") or {}).get("records", [])
        if records:
            return {"__cell__": facts["cell"], **{r["prompt_id"]: r["token_ids"] for r in records
                                                 if r.get("accepted") and r.get("token_ids")}}
    return {}


def _sequences(cell) -> tuple[list[dict], str | None]:
    options = cell.options.scoring
    reference = _reference_outputs(cell)
    reference_cell = reference.pop("__cell__", None)
    kinds = set(options.continuation_kinds)
    sequences = []
    for prompt in cell.prompts:
        if prompt.kind not in kinds or prompt.id not in reference:
            continue
        ids = list(prompt.token_ids) + list(reference[prompt.id])
        sequences.append({"id": f"cont:{prompt.id}", "kind": "continuation", "token_ids": ids,
                          "scored_from": len(prompt.token_ids)})
    if cell.run_dir is not None and cell.run_dir.scoring_path.is_file():
        for document in read_json(cell.run_dir.scoring_path):
            sequences.append({"id": document["id"], "kind": "document", "token_ids": document["token_ids"],
                              "scored_from": 1})
    # Only what fits: vLLM refuses a prompt of max_model_len tokens or more (still recorded below).
    return sequences, reference_cell


def _attach(sequences: list[dict], results: list[dict]) -> list[dict]:
    stored = []
    for sequence, result in zip(sequences, results):
        entry = {**sequence, "accepted": result["accepted"], "rejection": result.get("rejection"),
                 "error": result.get("error")}
        if result["accepted"]:
            # positions[j] is about token j+1; keep the scored part only.
            entry["positions"] = result["positions"][sequence["scored_from"] - 1:]
        stored.append(entry)
    return stored


def run(engine, cell) -> dict:
    options = cell.options.scoring
    top_k = options.top_k
    sequences, reference_cell = _sequences(cell)
    cell.emit(event="step", phase="scoring", done=0, total=len(sequences))
    results = []
    for index, sequence in enumerate(sequences):
        cell.emit(event="step", phase="scoring", done=index, total=len(sequences), item=sequence["id"])
        results.extend(engine.score([sequence["token_ids"]], top_k))
    phase = {"top_k": top_k, "reference_cell": reference_cell, "sequences": _attach(sequences, results)}
    if cell.kv_spec == BASELINE_KV and options.noise and sequences:
        cell.emit(event="step", phase="scoring", done=len(sequences), total=len(sequences), item="noise re-score")
        together = engine.score([s["token_ids"] for s in sequences], top_k, together=True)
        phase["noise"] = {"method": "same sequences re-scored in one batch (different batch composition)",
                          "sequences": _attach(sequences, together)}
    return phase

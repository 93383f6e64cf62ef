"""Is an engine's first call of a kind slower than the same call repeated (issue 18)? Starts the engine of a
run's cell spec, runs the cell's greedy generation batch (as the generation phase does), then the cell's
scoring batch three times in a row, and prints each call's seconds and tokens per second. The scoring
phase's efficiency compares its call (the first) with a reference call right after it (the second):
if the first is much slower than the second and third, the gap is the engine's own first-call cost, not
how kveval fed it.

    .venv/bin/python scripts/time_repeated_call.py RUN_DIR/cells/auto-1024.spec.json
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main(spec_path: str) -> None:
    from kveval.files.cell_spec import CellSpec
    from kveval.files.rundir import read_json
    from kveval.worker.engine import Engine, EngineSettings

    spec = CellSpec.model_validate(read_json(Path(spec_path)))
    cell = json.loads(Path(spec.result_path).read_text())
    engine = Engine.start(EngineSettings(**spec.engine))
    prompts = read_json(Path(spec.workloads_path))
    generation = [(list(p["token_ids"]), int(p["max_tokens"]), None) for p in prompts
                  if len(p["token_ids"]) < spec.engine["max_model_len"]]
    began = time.perf_counter()
    engine.generate_batch(generation)
    print(f"generation batch of {len(generation)}: {time.perf_counter() - began:.2f} s", flush=True)
    scoring = cell["phases"]["scoring"]
    sequences = [s["token_ids"] for s in scoring["sequences"] if s.get("token_ids")]
    if not sequences:
        raise SystemExit("the cell file keeps no scored token ids")
    tokens = sum(len(ids) for ids in sequences)
    for attempt in range(1, 4):
        began = time.perf_counter()
        engine.score(sequences, int(scoring["top_k"]))
        seconds = time.perf_counter() - began
        print(f"scoring call {attempt} ({len(sequences)} sequences, {tokens} tokens): {seconds:.2f} s, "
              f"{tokens / seconds:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

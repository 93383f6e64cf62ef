"""How long a cell process takes to end after its work (issue 18): start the engine of a run's cell spec,
generate once, then end the process the normal way (vLLM's and torch's teardown) or with os._exit, as
worker/cell_main.py now does. Prints both, each timed from the line the child prints when it is done to
the child's end, as seen by this parent.

    .venv/bin/python scripts/time_cell_exit.py RUN_DIR/cells/fp8-1024.spec.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CHILD = """
import os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from kveval.worker.engine import Engine, EngineSettings
import json
spec = json.load(open(sys.argv[1]))
engine = Engine.start(EngineSettings(**spec["engine"]))
engine.generate_batch([([1, 2, 3, 4], 8, [])])
print("DONE", flush=True)
if sys.argv[2] == "fast":
    sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
sys.exit(0)
"""


def exit_seconds(spec: str, mode: str) -> float:
    child = subprocess.Popen([sys.executable, "-c", CHILD, spec, mode], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    done = None
    for line in child.stdout:
        if line.startswith("DONE"):
            done = time.perf_counter()
    child.wait()
    if done is None or child.returncode != 0:
        raise SystemExit(f"the {mode} child failed (exit {child.returncode})")
    return time.perf_counter() - done


def main() -> int:
    if len(sys.argv) != 2 or not os.path.isfile(sys.argv[1]):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    figures = {mode: round(exit_seconds(sys.argv[1], mode), 2) for mode in ("normal", "fast")}
    print(json.dumps({"spec": sys.argv[1], "exit_seconds": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

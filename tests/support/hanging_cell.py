"""Stands in for `python -m kveval.worker.cell_main SPEC` in the stall test: an engine that starts,
finishes generation, finishes one scoring step and then hangs (as a kept-layer remedy cell did on
the H200). Invoked as `python hanging_cell.py -m kveval.worker.cell_main SPEC`."""
import faulthandler
import json
import signal
import sys
import time
from pathlib import Path

faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # as cell_main does
spec = json.loads(Path(sys.argv[-1]).read_text())
events = Path(spec["events_path"])


def emit(**event):
    with events.open("a") as handle:
        handle.write(json.dumps({**event, "t": time.time()}) + "\n")


# A started cell's record as cell_main writes it (the parent reads it back as a cell file).
facts = {"schema_version": 2, "cell": spec["cell_id"], "kv_spec": spec["kv_spec"], "max_model_len": 1024, "complete": False,
         "phases": {"generation": {"sampling": {"temperature": 0.0}, "records": [{"prompt_id": "p", "accepted": True}]}},
         "started": True, "capacity": {"kv_pool_tokens": 4096, "kv_pool_tokens_source": "test", "max_concurrency": 4.0,
                                       "num_blocks": None, "block_size": None, "cache_dtype": "fp8"},
         "info": {"attention_backend": None}, "logged_capacity": {"kv_pool_tokens": None, "max_concurrency": None}}
Path(spec["result_path"]).write_text(json.dumps(facts))
emit(event="phase", phase="engine_start", pid=0)
emit(event="outcome", started=True, kv_pool_tokens=4096)
emit(event="phase", phase="generation")
emit(event="phase", phase="scoring")
emit(event="step", phase="scoring", done=5, total=10, item="doc:6554")
print("scoring 5/10", flush=True)


def hang_in_the_scheduler():
    time.sleep(600)


hang_in_the_scheduler()

"""`python -m tests.support.tiny_compare compare ARGS...`: the real `kveval` CLI, with the built-in
workloads cut to one over-length prompt (the --prompts file adds the rest), so fault-injection tests
on the real engine stay short. KVEVAL_TEST_COUNTS (JSON) sets other counts, so a CLI run can repeat
an API run of the tests. Everything else — options, cells, signals, exit codes — is kveval's."""
from __future__ import annotations

import json
import os

from kveval import api
from kveval.cli.commands import main

TINY_COUNTS = {"short_256": 0, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 1}

_real_compare = api.compare


def _tiny_compare(*args, **kwargs):
    counts = json.loads(os.environ["KVEVAL_TEST_COUNTS"]) if os.environ.get("KVEVAL_TEST_COUNTS") else TINY_COUNTS
    return _real_compare(*args, counts=counts, **kwargs)


if __name__ == "__main__":
    api.compare = _tiny_compare
    main()

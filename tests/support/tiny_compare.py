"""`python -m tests.support.tiny_compare compare ARGS...`: the real `kveval` CLI, with the built-in
workloads cut to one over-length prompt (the --prompts file adds the rest), so fault-injection tests
on the real engine stay short. Everything else — options, cells, signals, exit codes — is kveval's."""
from __future__ import annotations

from kveval import api
from kveval.cli.commands import main

TINY_COUNTS = {"short_256": 0, "short_512": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 1}

_real_compare = api.compare


def _tiny_compare(*args, **kwargs):
    return _real_compare(*args, counts=TINY_COUNTS, **kwargs)


if __name__ == "__main__":
    api.compare = _tiny_compare
    main()

"""`python -m kveval.worker.probe`: print, as one JSON line, what the installed vLLM accepts (its
engine argument names and KV-cache dtypes), for run/vllm_vocabulary.py. Starts no engine."""
from __future__ import annotations

import json
import sys


def main() -> int:
    from kveval.worker.engine import vllm_vocabulary

    print(json.dumps(vllm_vocabulary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

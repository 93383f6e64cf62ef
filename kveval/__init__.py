"""kveval: may this model run with an FP8 KV cache? One command, with evidence."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "compare", "report", "load_run"]


def __getattr__(name: str):
    # Keep `import kveval` (and `kveval --help`) light: the API pulls in pandas and friends.
    if name in ("compare", "report", "load_run"):
        from kveval import api

        return getattr(api, name)
    raise AttributeError(name)

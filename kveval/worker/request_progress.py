"""Progress of one `LLM.generate` batch, request by request.

vLLM's offline loop (entrypoints/common/offline.py `_run_engine`, vLLM 0.32) updates its tqdm bar once
per finished request, and accepts a tqdm factory as `use_tqdm`. `reporting_bar` is such a factory: the
bar draws nothing and passes each update on, so a batch that is slow but moving (a loaded CPU) reports
progress and is not taken for a stalled engine (run/cell_process.py).
"""
from __future__ import annotations

import os
from typing import Callable

from tqdm import tqdm


def reporting_bar(on_finished: Callable[[int], None]) -> Callable[..., tqdm]:
    """A tqdm class whose `update(n)` also calls `on_finished(n)`."""

    class ReportingBar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.update(file=open(os.devnull, "w"), mininterval=3600.0)
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            on_finished(n)
            return super().update(n)

        def close(self):
            handle = self.fp
            super().close()
            handle.close()

    return ReportingBar

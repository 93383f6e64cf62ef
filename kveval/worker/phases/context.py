"""What a phase receives besides the engine: the cell's settings, its prompts and a progress hook."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kveval.files.cell_spec import PhaseOptions
from kveval.files.rundir import RunDir
from kveval.inputs.workloads import PromptSpec


@dataclass
class CellContext:
    cell_id: str
    kv_spec: str                                            # the spec text the cell is named for (fp8:keep=0)
    max_model_len: int
    prompts: list[PromptSpec]
    options: PhaseOptions | None = None                     # every phase's settings (None: phases that take none)
    emit: Callable[..., None] = lambda **event: None        # progress events for the parent
    facts: dict[str, Any] = field(default_factory=dict)     # this cell's facts so far (earlier phases)
    run_dir: RunDir | None = None                           # to read cells that finished before this one
    model_path: str | None = None                           # the model the engine loaded (for its tokenizer)
    checkpoint: Callable[[], None] = lambda: None           # store facts now (a long phase saves as it goes)

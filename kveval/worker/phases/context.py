"""What a phase receives besides the engine: the cell's settings, its prompts, what the cell measured so far
(typed, as the cell file stores it) and hooks for progress and for storing a long phase as it goes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict

from kveval.files import schema
from kveval.files.cell_spec import PhaseOptions
from kveval.files.rundir import RunDir, read_json
from kveval.inputs.workloads import PromptSpec


@dataclass
class CellContext:
    cell_id: str
    kv_spec: str                                            # the spec text the cell is named for (fp8:keep=0)
    max_model_len: int
    prompts: list[PromptSpec]
    options: PhaseOptions | None = None                     # every phase's settings (None: phases that take none)
    emit: Callable[..., None] = lambda **event: None        # progress events for the parent
    capacity: schema.Capacity | None = None                 # the started engine's KV pool (None: not known)
    finished: dict[str, schema.Phase] = field(default_factory=dict)   # this cell's earlier phases, by name
    run_dir: RunDir | None = None                           # to read cells that finished before this one
    model_path: str | None = None                           # the model the engine loaded (for its tokenizer)
    checkpoint: Callable[[], None] = lambda: None           # write the cell's file now, as it stands
    # Store a long phase's result so far (name, record) and write the file: a crash keeps what it measured.
    keep_partial: Callable[[str, schema.Phase], None] = lambda name, phase: None


class ScoringDocument(BaseModel):
    """One corpus document of a run's scoring.json (or a scoring round's documents file, run/setup.py and
    run/rounds.py write them): the sequence the scoring phase scores, the throughput phase's long prompt."""

    model_config = ConfigDict(extra="ignore")

    id: str
    token_ids: list[int]


def read_documents(path: Path) -> list[ScoringDocument]:
    return [ScoringDocument.model_validate(document) for document in read_json(path)]

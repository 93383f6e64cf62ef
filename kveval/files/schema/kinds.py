"""The file kinds: each kind's model, current version, version of a file that writes none, and what to
do with a file of another version."""
from __future__ import annotations

from kveval.files.schema.base import CELL_VERSION, FileModel, KV_RANGES_VERSION, MANIFEST_VERSION, RESULTS_VERSION
from kveval.files.schema.cell import CellResult
from kveval.files.schema.evidence import Evidence
from kveval.files.schema.kv_ranges import KvRanges
from kveval.files.schema.manifest import Manifest
from kveval.files.schema.results import Results


KINDS: dict[str, type[FileModel]] = {"manifest": Manifest, "cell": CellResult, "results": Results,
                                 "kv_ranges": KvRanges}
VERSIONS: dict[type[FileModel], int] = {Manifest: MANIFEST_VERSION, CellResult: CELL_VERSION,
                                    Results: RESULTS_VERSION, Evidence: RESULTS_VERSION, KvRanges: KV_RANGES_VERSION}
# Files written without a schema_version (cell files before version 2; a failed kv_ranges.json) read as this.
_DEFAULT_VERSION = {CellResult: 1, KvRanges: KV_RANGES_VERSION}
_REDO = {Manifest: "re-run with the kveval that wrote it, or start a new run",
         CellResult: "re-run with the kveval that wrote it, or re-run the cell",
         Results: "re-run with the kveval that wrote it, or run `kveval report` on the run again",
         Evidence: "run `kveval report` on the run again",
         KvRanges: "re-run with the kveval that wrote it, or delete it to measure again"}


def _model(kind_or_model: str | type[FileModel]) -> type[FileModel]:
    if isinstance(kind_or_model, str):
        if kind_or_model not in KINDS:
            raise ValueError(f"unknown file kind {kind_or_model!r}; known: {', '.join(KINDS)}")
        return KINDS[kind_or_model]
    return kind_or_model

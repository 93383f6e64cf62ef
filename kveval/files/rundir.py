"""The run directory: a manifest, the workloads, and one result file per cell.

Every file is written atomically (temp file + rename) the moment it is known, so a crash or a
Ctrl-C never leaves a half-written result and never loses a finished cell. The layout is an API:
`kveval report DIR` rebuilds everything from these files alone.

    DIR/manifest.json           command, model, versions, hardware, options, planned cells
    DIR/workloads.json          every prompt (text + token ids) sent to every cell
    DIR/scoring.json            documents every cell scores teacher-forced (token ids)
    DIR/cells/<cell>.json       one cell's facts (start-up, capacity, phases)
    DIR/cells/<cell>.log        that cell's process output (vLLM's own words)
    DIR/review.md               the rendered review
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


class StoreError(Exception):
    """A run directory is missing, unreadable, or not a kveval run."""


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """The one atomic write: a temp file beside the target, then a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; run directories are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any, *, compact: bool = False) -> None:
    """JSON, atomically. `compact` for bulky data (token id lists)."""
    text = json.dumps(data, indent=None if compact else 1, ensure_ascii=False, default=str,
                      separators=(",", ":") if compact else None)
    write_text_atomic(path, text + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{path} does not exist") from None
    except json.JSONDecodeError as error:
        raise StoreError(f"{path} is not valid JSON ({error})") from None


def cell_id(kv_cache_dtype: str, max_model_len: int) -> str:
    return f"{kv_cache_dtype}-{max_model_len}"


class RunDir:
    """Every path of a run directory, and the readers of its files. Nothing else builds these paths."""

    RESULTS_FILE = "results.json"
    REVIEW_FILE = "review.md"
    TABLES_DIR = "tables"
    TASK_HEATMAP = "tasks_heatmap.png"   # review.md links figures by these relative names
    KV_RANGE_PLOT = "kv_range.png"
    TASK_DATA_DIR = "taskdata"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    @property
    def workloads_path(self) -> Path:
        return self.path / "workloads.json"

    @property
    def scoring_path(self) -> Path:
        return self.path / "scoring.json"

    @property
    def kv_ranges_path(self) -> Path:
        return self.path / "kv_ranges.json"

    @property
    def kv_scales_path(self) -> Path:
        return self.path / "kv_scales.json"

    @property
    def review_path(self) -> Path:
        return self.path / self.REVIEW_FILE

    @property
    def results_path(self) -> Path:
        return self.path / self.RESULTS_FILE

    def table_path(self, name: str) -> Path:
        return self.path / self.TABLES_DIR / f"{name}.csv"

    @property
    def task_heatmap_path(self) -> Path:
        return self.path / self.TASK_HEATMAP

    @property
    def kv_range_plot_path(self) -> Path:
        return self.path / self.KV_RANGE_PLOT

    def task_data_path(self, relative: str) -> Path:
        """A task data directory the manifest's `task_data` names (relative to the run)."""
        return self.path / relative

    @property
    def cells_dir(self) -> Path:
        return self.path / "cells"

    def cell_path(self, cell: str) -> Path:
        return self.cells_dir / f"{cell}.json"

    def cell_log_path(self, cell: str) -> Path:
        return self.cells_dir / f"{cell}.log"

    def cell_events_path(self, cell: str) -> Path:
        return self.cells_dir / f"{cell}.events.jsonl"

    def cell_spec_path(self, cell: str) -> Path:
        return self.cells_dir / f"{cell}.spec.json"

    # -- reading ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def load_manifest(self) -> dict:
        if not self.path.is_dir():
            raise StoreError(f"{self.path}: no such run directory")
        if not self.manifest_path.is_file():
            raise StoreError(f"{self.path} is not a kveval run directory (no manifest.json)")
        manifest = read_json(self.manifest_path)
        version = manifest.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.manifest_path}: schema_version {version!r}, this kveval reads {SCHEMA_VERSION}")
        return manifest

    def load_workloads(self) -> list[dict]:
        return read_json(self.workloads_path) if self.workloads_path.is_file() else []

    def load_kv_ranges(self) -> dict | None:
        """The per-layer K/V range measurement, or None when this run made none."""
        return read_json(self.kv_ranges_path) if self.kv_ranges_path.is_file() else None

    def load_cell(self, cell: str) -> dict | None:
        path = self.cell_path(cell)
        return read_json(path) if path.is_file() else None

    def load_cells(self, manifest: dict | None = None) -> dict[str, dict]:
        """Cells in the manifest's planned order; a planned cell with no file yet is left out."""
        manifest = manifest or self.load_manifest()
        cells = {}
        for planned in manifest.get("cells", []):
            data = self.load_cell(planned["id"])
            if data is not None:
                cells[planned["id"]] = data
        return cells

"""The run directory: a manifest, the workloads, and one result file per cell.

Every file is written atomically (temp file, fsync, rename) the moment it is known, so a crash, a
Ctrl-C or a full disk never leaves a half-written result and never loses a finished cell; a write
that finds the disk full leaves the previous version and raises DiskFull. The layout is an API:
`kveval report DIR` rebuilds everything from these files alone.

    DIR/manifest.json           command, model, versions, hardware, options, planned cells
    DIR/workloads.json          every prompt (text + token ids) sent to every cell
    DIR/scoring.json            documents every cell scores teacher-forced (token ids)
    DIR/cells/<cell>.json       one cell's facts (start-up, capacity, phases)
    DIR/cells/<cell>.log        that cell's process output (vLLM's own words)
    DIR/cells/<cell>.tasks-r<k>.json   a later round of that cell's evidence (task samples, probe outputs;
                                read with the cell)
    DIR/rounds/probes-r<k>.json the new degeneration probes of round k (read with the workloads)
    DIR/.kveval.lock            held by the live run (files/run_lock.py)
    DIR/kv_ranges.json          per-layer K/V ranges (the diagnosis pass), when the run made one
    DIR/results.json            evidence + verdict (`kveval report` writes it; .json.gz in published reports)
    DIR/tables/*.csv, *.png     the evidence as tables and figures
    DIR/review.md               the rendered review
    DIR/review.html             the same review as one self-contained page (figures inline), to share

manifest, cell, results and kv_ranges files are validated against kveval.files.schema when read
(and kveval's own documents when written), so a damaged or older file is named with its bad field.
"""
from __future__ import annotations

import errno
import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any, cast

from kveval.files import schema
from kveval.files.task_rounds import design_of, merge_rounds, round_cell_id, rounds_of, streams_of

SCHEMA_VERSION = schema.MANIFEST_VERSION


class StoreError(Exception):
    """A run directory is missing, unreadable, or not a kveval run."""


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_WORDS = ("No space left on device", "Disk quota exceeded")   # the same, as a child's log says it
DISK_FULL_EXIT = 28   # a cell process that stopped on DiskFull exits with this (ENOSPC's number)


def mount_point(path: Path) -> Path:
    """The mount that holds path (which need not exist yet)."""
    current = Path(os.path.abspath(path))
    while not os.path.ismount(current) and current != current.parent:
        current = current.parent
    return current


class DiskFull(StoreError):
    """A write found no space left (or the quota spent); the file keeps its previous version."""

    def __init__(self, path: Path):
        self.path = Path(path)
        super().__init__(f"no space left on {mount_point(self.path)} while writing {self.path}")


def ensure_writable_dir(path: Path, label: str) -> None:
    """Prove that `path` is (or can become) a directory kveval can write in, before any work depends
    on it; creates nothing that is not there, so a refused run leaves no trace."""
    if path.exists() and not path.is_dir():
        raise StoreError(f"{label} {path} exists and is not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise StoreError(f"{label} {path}: {existing} is a file, not a directory")
    try:
        if existing == path:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".kveval-write-check-"):
                pass
        elif not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied or read-only file system")
    except OSError as error:
        raise StoreError(f"{label} {path}: cannot write there ({error.strerror or error})") from None


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """The one atomic write: a temp file beside the target, then a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())   # on disk before the rename makes it the file
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; run directories are meant to be shared
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
            raise DiskFull(path) from None
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Text, atomically; a path ending in .gz is gzip-compressed (mtime 0, so the bytes are reproducible)."""
    data = text.encode("utf-8")
    write_bytes_atomic(path, gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)


def write_json_atomic(path: Path, data: Any, *, compact: bool = False) -> None:
    """JSON, atomically. `compact` for bulky data (token id lists)."""
    text = json.dumps(data, indent=None if compact else 1, ensure_ascii=False, default=str,
                      separators=(",", ":") if compact else None)
    write_text_atomic(path, text + "\n")


def _validated(kind: str, path: Path) -> dict[str, Any]:
    """One run file, checked against its schema; the plain dict as it was read, a file of the version
    before brought up to date in place by schema.parse (what its model dumps to, without walking a 30 MB
    cell twice)."""
    try:
        data = schema.read(path)
        schema.parse(kind, data, str(path))   # a JSON object once parsed
        return cast(dict[str, Any], data)
    except schema.FileError as error:
        raise StoreError(str(error)) from None


def read_json(path: Path) -> Any:
    try:
        if path.suffix == ".gz":
            return json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{path} does not exist") from None
    except json.JSONDecodeError as error:
        raise StoreError(f"{path} is not valid JSON ({error})") from None


def cell_id(kv_spec: str, max_model_len: int) -> str:
    return f"{kv_spec}-{max_model_len}"


class RunDir:
    """Every path of a run directory, and the readers of its files. Nothing else builds these paths."""

    RESULTS_FILE = "results.json"
    REVIEW_FILE = "review.md"
    REVIEW_HTML_FILE = "review.html"
    TABLES_DIR = "tables"
    TASK_HEATMAP = "tasks_heatmap.png"   # review.md links figures by these relative names
    KV_RANGE_PLOT = "kv_range.png"
    CAPACITY_PLOT = "kv_capacity.png"
    THROUGHPUT_PLOT = "throughput.png"
    KL_POSITION_PLOT = "kl_by_position.png"
    TASK_DATA_DIR = "taskdata"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        # Typed cell files by path, with the (mtime, size, inode) they were read at: the parent looks at
        # the evidence after every cell and round (issue 18), and re-parsing every unchanged file each
        # time was most of a look. A file rewritten in any way is read again.
        self._typed_cells: dict[str, tuple[tuple[int, int, int], schema.CellResult]] = {}

    @staticmethod
    def _identity(path: Path) -> tuple[int, int, int]:
        stat = path.stat()
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def _typed_cell_file(self, path: Path) -> schema.CellResult:
        """schema.load of a cell file, once per version of it (FileError as schema.load raises it)."""
        try:
            identity = self._identity(path)
        except OSError:
            return schema.load(schema.CellResult, path)   # raises FileError saying why
        cached = self._typed_cells.get(str(path))
        if cached is not None and cached[0] == identity:
            return cached[1]
        result = schema.load(schema.CellResult, path)
        self._typed_cells[str(path)] = (identity, result)
        return result

    def remember_cell(self, cell: str, result: schema.CellResult) -> None:
        """The typed record of the cell file just written from the same data (the parent after a cell
        process): its next read is not a parse."""
        path = self.cell_path(cell)
        try:
            self._typed_cells[str(path)] = (self._identity(path), result)
        except OSError:
            pass

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
    def review_html_path(self) -> Path:
        return self.path / self.REVIEW_HTML_FILE

    @property
    def thresholds_path(self) -> Path:
        """The gate's limits the run was judged with: `kveval report` / `gate` re-judge with them."""
        return self.path / "thresholds.json"

    def load_thresholds(self) -> dict[str, Any] | None:
        return read_json(self.thresholds_path) if self.thresholds_path.is_file() else None

    @property
    def results_path(self) -> Path:
        """results.json; a published report keeps it compressed (results.json.gz) and it stays so."""
        plain = self.path / self.RESULTS_FILE
        packed = self.path / f"{self.RESULTS_FILE}.gz"
        return packed if packed.is_file() and not plain.is_file() else plain

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

    CELLS_DIR = "cells"

    @property
    def cells_dir(self) -> Path:
        return self.path / self.CELLS_DIR

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

    def load_manifest(self) -> dict[str, Any]:
        if not self.path.is_dir():
            raise StoreError(f"{self.path}: no such run directory")
        if not self.manifest_path.is_file():
            raise StoreError(f"{self.path} is not a kveval run directory (no manifest.json)")
        return _validated("manifest", self.manifest_path)

    def manifest(self) -> schema.Manifest:
        """manifest.json as the typed model (what run/ reads by attribute); StoreError as load_manifest."""
        if not self.path.is_dir():
            raise StoreError(f"{self.path}: no such run directory")
        if not self.manifest_path.is_file():
            raise StoreError(f"{self.path} is not a kveval run directory (no manifest.json)")
        try:
            return schema.load(schema.Manifest, self.manifest_path)
        except schema.FileError as error:
            raise StoreError(str(error)) from None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """The manifest, checked against its schema first: kveval never writes a file it would refuse."""
        schema.parse("manifest", json.loads(json.dumps(manifest, default=str)), str(self.manifest_path))
        write_json_atomic(self.manifest_path, manifest)

    def has_cell_files(self) -> bool:
        return self.cells_dir.is_dir() and any(p for p in self.cells_dir.glob("*.json")
                                               if not p.name.endswith(".spec.json"))

    def results(self) -> schema.Results:
        """results.json (or .json.gz) as the typed model."""
        try:
            return schema.load(schema.Results, self.results_path)
        except schema.FileError as error:
            raise StoreError(str(error)) from None

    ROUNDS_DIR = "rounds"

    def round_documents_path(self, round_number: int, max_model_len: int) -> Path:
        """Round k's new scoring documents at one length (run/rounds.py), dicts like scoring.json's."""
        return self.path / self.ROUNDS_DIR / f"documents-r{round_number}-L{max_model_len}.json"

    def round_probes_path(self, round_number: int) -> Path:
        """The prompts of round k's degeneration probes (run/rounds.py), PromptSpec dicts like workloads.json."""
        return self.path / self.ROUNDS_DIR / f"probes-r{round_number}.json"

    def load_workloads(self, manifest: schema.Manifest | dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """workloads.json, then every later round's probes the manifest records (each round once). A manifest
        given as `load_manifest`'s dict is read as the typed model."""
        if isinstance(manifest, dict):
            manifest = schema.parse(schema.Manifest, manifest, str(self.manifest_path))
        prompts = read_json(self.workloads_path) if self.workloads_path.is_file() else []
        seen: set[str] = set()
        record = manifest.task_rounds if manifest is not None else None
        for entry in record.rounds if record is not None else []:
            relative = entry.probes.file if entry.probes is not None else None
            if relative and relative not in seen and (self.path / relative).is_file():
                seen.add(relative)
                prompts = prompts + read_json(self.path / relative)
        return prompts

    def load_kv_ranges(self) -> schema.KvRanges | None:
        """The per-layer K/V range measurement (typed), or None when this run made none."""
        if not self.kv_ranges_path.is_file():
            return None
        try:
            return schema.load(schema.KvRanges, self.kv_ranges_path)
        except schema.FileError as error:
            raise StoreError(str(error)) from None

    def finished_cell_count(self) -> int:
        """Cell files that hold a complete record (what a resume keeps), read leniently."""
        count = 0
        for path in self.cells_dir.glob("*.json") if self.cells_dir.is_dir() else ():
            if path.name.endswith(".spec.json"):
                continue
            try:
                count += bool(json.loads(path.read_text(encoding="utf-8")).get("complete"))
            except (OSError, ValueError, AttributeError):
                continue
        return count

    def load_cell(self, cell: str, *, validate: bool = True) -> dict[str, Any] | None:
        """One cell's result, or None before it has one. `validate=False` for kveval's own processes
        reading a file a child just wrote (still running, or to add what the parent saw); a file of the
        version before is brought up to date either way (schema.upgrade), so what is written back is current."""
        path = self.cell_path(cell)
        if not path.is_file():
            return None
        return _validated("cell", path) if validate else schema.upgrade("cell", read_json(path))

    def cell_result(self, cell: str, manifest: schema.Manifest | None = None) -> schema.CellResult | None:
        """One cell's result as the typed model, its later rounds merged in (files/task_rounds.py);
        None before it has a result file. Each file is validated once (errors name the file)."""
        path = self.cell_path(cell)
        if not path.is_file():
            return None
        rounds, design = rounds_of(manifest, cell), design_of(manifest, cell)
        try:
            result = self._typed_cell_file(path)
            if not (rounds or design):
                return result
            records: list[tuple[int, schema.CellResult | None]] = []
            for number in rounds:
                round_path = self.cell_path(round_cell_id(cell, number))
                records.append((number, self._typed_cell_file(round_path) if round_path.is_file() else None))
        except schema.FileError as error:
            raise StoreError(str(error)) from None
        return merge_rounds(result, records, design, streams_of(manifest, cell))

    def cell_results(self, manifest: schema.Manifest | None = None) -> dict[str, schema.CellResult]:
        """The typed cells in the manifest's planned order, rounds merged (`cell_result`); a planned cell
        with no file yet is left out. What the analyses read (evidence.build_evidence)."""
        manifest = manifest or self.manifest()
        cells = {}
        for planned in manifest.cells:
            result = self.cell_result(planned.id, manifest)
            if result is not None:
                cells[planned.id] = result
        return cells

    def round_results(self, manifest: schema.Manifest | None = None) -> dict[str, schema.CellResult]:
        """Each task round's own record (cells/<cell>.tasks-r<k>.json, not merged), by its id, for the
        planned cells' rounds that have a file: the time table counts each round's process."""
        manifest = manifest or self.manifest()
        out = {}
        try:
            for planned in manifest.cells:
                for number in rounds_of(manifest, planned.id):
                    path = self.cell_path(round_cell_id(planned.id, number))
                    if path.is_file():
                        out[round_cell_id(planned.id, number)] = self._typed_cell_file(path)
        except schema.FileError as error:
            raise StoreError(str(error)) from None
        return out

    def load_cells(self, manifest: schema.Manifest | None = None) -> dict[str, dict[str, Any]]:
        """Cells in the manifest's planned order, as plain dicts (for the run/ modules that still read
        them by key; the analyses read `cell_results`); a planned cell with no file yet is left out. A
        cell with later rounds (manifest `task_rounds`) carries their task samples and probe outputs
        too (files/task_rounds.py)."""
        manifest = manifest or self.manifest()
        cells = {}
        for planned in manifest.cells:
            cell = planned.id
            if rounds_of(manifest, cell) or design_of(manifest, cell):
                merged = self.cell_result(cell, manifest)
                if merged is not None:
                    cells[cell] = schema.dump(merged)
            elif (data := self.load_cell(cell)) is not None:
                cells[cell] = data   # as read (validated): no model to dump back
        return cells

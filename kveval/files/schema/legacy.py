"""Files of an older version: one step of `upgrade` brings a file of the version just before its kind's
current one up to date as it is read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from kveval.files.schema.base import FileModel
from kveval.files.schema.cell import CellResult
from kveval.files.schema.evidence import Evidence
from kveval.files.schema.kinds import VERSIONS, _DEFAULT_VERSION, _model
from kveval.files.schema.manifest import Manifest
from kveval.files.schema.results import Results


# --- older versions ------------------------------------------------------------------------------
#
# A file of the version just before its kind's current one is read after one step of `upgrade`, in place
# and before validation: the keys below are renamed where the table says (keeping each key's position)
# and the file's schema_version becomes the current one, so the model, `dump` and a reader that keeps the
# read dict (rundir._validated) all see the current shape. Any other version is refused as ever (parse).
#
# Issue 17: the user's KV spec text was `kv_cache_dtype`, the name vLLM gives its engine dtype; it is
# `kv_spec` now, and `kv_cache_dtype` stays only where it is vLLM's (a cell's engine_settings, a planned
# cell's engine, a diagnosis in evidence.diagnosis): those are not on the paths below.
#
# A path is a tuple of keys from the top of the document; "*" is every item of a list or every value of an
# object; a step that is absent or null (evidence of a run without throughput, `tasks` {} with no
# tasks) holds nothing to rename.

_Path = tuple[str, ...]
_KV_SPEC_IN_EVIDENCE: tuple[_Path, ...] = (
    ("cells", "*"),                        # EvidenceCell
    ("pools", "*"),                        # PoolRow
    ("divergence", "comparisons", "*"),    # Comparison (kv comparisons)
    ("degeneration", "cells", "*"),        # DegenerationCell
    ("degeneration", "findings", "*"),     # Finding
    ("startup", "*"),                      # StartupRow
    ("speed", "*"),                        # SpeedRow
    ("throughput", "*"),                   # ThroughputRow
    ("capacity_model", "*"),               # CapacityRow
    ("tasks", "sample_rows", "*"),         # TaskSampleRow
    ("tasks", "accuracy", "*"),            # TaskAccuracyRow
    ("tasks", "comparisons", "*"),         # TaskComparisonRow
    ("tasks", "grid", "*"),                # TaskGridRow
)


@dataclass(frozen=True)
class _Upgrade:
    """One step: a file of version `source` becomes its kind's current version."""

    source: int                            # the version this step reads (a missing one: _DEFAULT_VERSION)
    renamed: tuple[str, str]               # (old key, new key)
    at: tuple[_Path, ...]                  # the records whose key is renamed
    versions: tuple[_Path, ...] = ((),)    # the records whose schema_version becomes the current one


_KV_SPEC = ("kv_cache_dtype", "kv_spec")
_UPGRADES: dict[type[FileModel], _Upgrade] = {
    CellResult: _Upgrade(source=1, renamed=_KV_SPEC, at=((),)),                   # the cell's own key
    Manifest: _Upgrade(source=1, renamed=_KV_SPEC, at=(("cells", "*"),)),           # each planned cell
    Results: _Upgrade(source=2, renamed=_KV_SPEC, at=tuple(("evidence", *path) for path in _KV_SPEC_IN_EVIDENCE),
                      versions=((), ("evidence",))),
    Evidence: _Upgrade(source=2, renamed=_KV_SPEC, at=_KV_SPEC_IN_EVIDENCE),
}


def _records(node: Any, path: _Path) -> Iterator[dict[str, Any]]:
    """The objects at `path` below `node` ("*": every item or value); none where a step is missing."""
    if not path:
        if isinstance(node, dict):
            yield node
        return
    step, rest = path[0], path[1:]
    if step == "*":
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    else:
        children = [node[step]] if isinstance(node, dict) and step in node else []
    for child in children:
        yield from _records(child, rest)


def _replace_items(record: dict[str, Any], items: list[tuple[str, Any]]) -> None:
    record.clear()
    record.update(items)


def upgrade(kind_or_model: str | type[FileModel], data: Any) -> Any:
    """`data` (a file's JSON) of the version before its kind's current one, brought to the current one in
    place (`_UPGRADES`); any other data is returned as it is, for `parse` to accept or refuse."""
    model = _model(kind_or_model)
    step = _UPGRADES.get(model)
    if step is None or not isinstance(data, dict):
        return data
    version = data.get("schema_version", _DEFAULT_VERSION.get(model))
    if type(version) is not int or version != step.source:
        return data
    old, new = step.renamed
    for path in step.at:
        for record in _records(data, path):
            if old in record and new not in record:   # renamed where it stands
                _replace_items(record, [(new if key == old else key, value) for key, value in record.items()])
    for path in step.versions:
        for record in _records(data, path):
            if "schema_version" in record:
                record["schema_version"] = VERSIONS[model]
            else:   # a cell file of version 1: the key first, as kveval writes it now
                _replace_items(record, [("schema_version", VERSIONS[model]), *record.items()])
    return data

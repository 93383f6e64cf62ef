"""The calibration request the parent (run/calibration.py) hands the calibration child
(worker/calibrate.py or its test double worker/fake_calibrate.py), and the record the child leaves in
the checkpoint copy: one model for both children, so the review reads the same fields from either."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

RECORD_NAME = "kveval-calibration.json"   # written into the checkpoint copy: what made it


class CalibrationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    out: str
    strategy: str                      # compressed-tensors' QuantizationStrategy: "tensor" or "attn_head"
    documents: list[list[int]]         # token ids, one list per calibration sample
    document_names: list[str]          # which files they came from (the review names them)
    trust_remote_code: bool = False


class CalibrationRecord(BaseModel):
    """What made a calibrated copy (RECORD_NAME inside it; the manifest's calibration entry carries it)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str
    source_model: str
    documents: list[str]
    samples: int
    tokens: int
    device: str                        # "cuda", "cpu", or "fake"
    seconds: float
    llmcompressor: str
    compressed_tensors: str
    made: Optional[str] = None         # the test double stamps its copies

    @classmethod
    def of(cls, request: CalibrationRequest, **made_by: Any) -> "CalibrationRecord":
        return cls(strategy=request.strategy, source_model=request.model, documents=request.document_names,
                   samples=len(request.documents), tokens=sum(len(ids) for ids in request.documents), **made_by)


def publish_copy(partial: Path, out: Path, record: CalibrationRecord) -> dict[str, Any]:
    """Write the record into the finished copy and move it into place: a copy without its record is
    never at `out` (run/calibration.py reuses a copy only where the record is)."""
    (partial / RECORD_NAME).write_text(record.model_dump_json(indent=1, exclude_none=True))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return record.model_dump(exclude_none=True)

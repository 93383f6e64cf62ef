"""The calibration request the parent (run/calibration.py) hands the calibration child
(worker/calibrate.py), and the name of the record the child leaves in the checkpoint copy."""
from __future__ import annotations

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

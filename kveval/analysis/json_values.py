"""Analysis results as plain JSON values (numpy scalars, NaN and pandas NA made JSON-safe)."""
from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pandas as pd


def json_safe(value: Any) -> Any:
    """Plain JSON values: numpy scalars -> Python, NaN/inf/pd.NA -> None, tuples -> lists (recursively)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()]
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], json_safe(frame.to_dict("records")))

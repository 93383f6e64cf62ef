"""Typed models of the files kveval writes into a run directory, and one reader that checks them.

Files: manifest.json (`Manifest`), cells/<cell>.json (`CellResult`), results.json (`Results`, with
`Evidence` and `VerdictRecord`) and kv_ranges.json (`KvRanges`). `load(kind, path)` reads and
validates one file and raises `FileError` with a message that names the file and each bad field;
`dump(model)` gives back exactly the dict that was read (same keys, key order, ints, floats, NaN),
so a file re-written from a model stays byte-identical.

Models type what kveval's code reads, the evidence's tables row by row included (diff pairs, task
sample rows, start-up, speed, throughput...); rows keyed by cell id (the acceptance matrix) stay dicts.
Required keys are required and strictly typed (no "5" for 5), so damage is caught.

Versions and unknown fields. A cell file (`CellResult` and every part of it, `CellModel`) declares
every key kveval writes, and a key it does not declare is refused with a FileError naming the field:
a file from a newer kveval that added a field is never half-read with the new field silently kept.
Each file kind has a `schema_version` (cell files write it as their first key from version 2 on: a cell
file without one is version 1); a kveval that changes what a file holds raises that kind's version. A file
of the version just before the current one is brought up to date as it is read (`upgrade`, one step per
kind, a table of key paths in `_UPGRADES`: see legacy.py); a file of any other version is
refused before anything else is checked, with what to do (`_REDO`: re-run with the kveval that wrote
it, or re-run the cell). Two parts of a cell stay open: `engine_settings` (the user's --engine-arg
values for vLLM, as given) and a task sample's row (`TaskSample`: extra per-sample fields reach the
samples table). The manifest (`ManifestModel`: open only in the user's engine args and the dumped phase
settings) and kv_ranges.json (`KvRangesModel`: open only in its model and measurement facts) refuse unknown
keys alike, and so does results.json (every part of `Results`): its `schema_version` says which kveval
reads it. Open there too: a task sample's row (`TaskSampleRow`, the cell's `TaskSample` with its extra
fields).
Only pydantic and the standard library are imported: the files are the layer everything else stands on.

The models live in one module per file kind, every name re-exported here (`schema.Manifest`,
`schema.load(...)`): base.py (building blocks: FileModel, Number, versions, FileError), manifest.py,
cell.py, results.py (the document), verdict.py, evidence.py, evidence_quality.py and evidence_tasks.py
(its parts), kv_ranges.py, kinds.py (each kind's model and version), legacy.py (older versions: `upgrade`)
and io.py (`load`, `read`, `parse`, `dump`, `json_schema`).
"""
# Every public name of the package, as `from kveval.files import schema` gave it before the split.
from kveval.files.schema.base import (MANIFEST_VERSION, CELL_VERSION, RESULTS_VERSION, KV_RANGES_VERSION,
                                      MAX_REPORTED_ERRORS, FileError, Number, FileModel)
from kveval.files.schema.manifest import (ManifestModel, KvLayout, WeightsEntry, EncoderEntry, ModelEntry, Options, PromptFormat,
                                          KvScales, PlannedEngine, PlannedCell, Versions, Hardware, HostPlatform, TaskFile,
                                          TaskData, Remedy, RoundProbes, TaskRound, TaskRounds, ReferenceCell, BaselineOrigin, ImportedBaseline,
                                          ParentStep, RunTiming, CalibrationEntry, SearchLength, SearchRecord,
                                          Manifest)
from kveval.files.schema.cell import (CellModel, Failure, Capacity, LoggedCapacity, CellInfo, EngineSettings, Process,
                                      Stalled, Crash, Timing, GenerationRecord, Sampling, GenerationDesign,
                                      ProbeRound, ScoredPosition, ScoringDesign, ScoredSequence, ScoringNoise,
                                      TaskSample, TasksDesign, TaskRoundOutcome, Spread, SpeedRun, SpeedWorkload,
                                      ThroughputRequest, ThroughputRun, PhaseEfficiency, Phase, GenerationPhase,
                                      ScoringPhase, TasksPhase, SpeedPhase, ThroughputPhase, Phases, CellResult)
from kveval.files.schema.verdict import (Status, CellStatus, ProfileName, Budget, Profile, Reason, Check, Thresholds, NoiseSource,
                                         NoiseFloor, Defect, VerdictRecord)
from kveval.files.schema.evidence_quality import (Platform, EvidenceCell, PoolRow, DivergenceSummary, LateSummary,
                                                  DivergenceBucket, ClusterFigure, Comparison, Unmatched, Divergence,
                                                  DegenerationCell, Finding, Degeneration, DiffExcerpt, DiffPair,
                                                  DiffSummary, DiffExample, Diff)
from kveval.files.schema.evidence_tasks import (TaskCell, Pace, TaskSampleRow, TaskCounts, TaskAccuracyRow,
                                                TaskGridRow, TaskComparisonRow, TaskRun, TaskDesign, TaskEvidence)
from kveval.files.schema.evidence import (DiagnosedModel, RangeRow, OffendingRange, WorstRange, LargestRange,
                                          LargestRanges, QueryRanges, Diagnosis, DiagnosisFailed, TasksOrNone,
                                          DiagnosisOrFailed, Rejection, Acceptance, SampleRow, SampleOutputs,
                                          SpeedSettings, StartupRow, PhaseTiming, TimingRow, TimingTotals, SpeedRow,
                                          ThroughputRow, CapacityRow, AttributionBucket, Attribution, IdenticalSpecs,
                                          QualityReference, Evidence)
from kveval.files.schema.results import CostRatio, DeploymentCost, Goodput, Deployment, Decision, Results
from kveval.files.schema.kv_ranges import KvRangesModel, TensorRange, LayerRange, KvRanges
from kveval.files.schema.kinds import KINDS, VERSIONS
from kveval.files.schema.legacy import _UPGRADES, upgrade   # _UPGRADES: tests/unit/test_file_schemas.py reads the table
from kveval.files.schema.io import parse, load, read, dump, json_schema

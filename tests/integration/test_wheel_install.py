"""The built wheel, installed into a fresh virtual environment outside the checkout, finds its
shipped files: `kveval tasks path`, `kveval tasks generate` (the prompt corpus is not needed, the
task YAMLs are) and `kveval report` on a stored run. No engine; about 20-40 s.

The new environment reuses this test environment's dependencies through one .pth line naming its
site-packages. Paths added by a .pth line are not themselves scanned for .pth files, so the
checkout's editable kveval (an __editable__ finder .pth there) must not leak in; asserted below.
The wheel is built from a clean copy of the checkout's sources: a stale build/ in the checkout
would otherwise be packed into it (setuptools reuses build/lib), and nothing is written into the
checkout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine  # a wheel build and a new venv: the slow suite (make test), not make unit

REPO = Path(__file__).resolve().parents[2]
DEMO_RUN = REPO / "reports" / "cpu-demo"
VERDICT_CODES = {0, 1, 3, 4}  # PASS, FAIL, INCONCLUSIVE, a configuration kveval found passes (2: usage error)


def _env() -> dict:
    env = dict(os.environ)  # KVEVAL_HOME, HF_* and friends pass through
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__"):
        env.pop(name, None)  # nothing may point the new interpreter back at the checkout
    return env


def _run(args, cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "kveval", src / "kveval", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = root / "dist"
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, src], cwd=root)
    assert proc.returncode == 0, _show(proc)
    (built,) = out.glob("kveval-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    assert not _inside(root, REPO)
    target = root / "venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    proc = _run([base, "-m", "venv", target], cwd=root)
    assert proc.returncode == 0, _show(proc)
    python = target / "bin" / "python"
    # Install before the .pth exists: pip must not see (and replace) this environment's editable kveval.
    proc = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", wheel],
                cwd=root)
    assert proc.returncode == 0, _show(proc)
    proc = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root)
    assert proc.returncode == 0, _show(proc)
    site = Path(proc.stdout.strip())
    assert _inside(site, target), site
    (site / "kveval-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return target


def test_wheel_ships_the_data_and_task_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("kveval/inputs/data/questions.jsonl", "kveval/inputs/data/README.md",
                 "kveval/inputs/lm_eval_tasks/kveval_longctx.yaml", "kveval/inputs/lm_eval_tasks/utils.py"):
        assert name in names, sorted(n for n in names if "/inputs/" in n)
    assert any(n.startswith("kveval/inputs/data/corpus/") and n.endswith(".txt") for n in names)
    src = wheel.parent.parent / "src"  # the copy it was built from: every file, nothing stale
    shipped = {p.relative_to(src).as_posix() for p in (src / "kveval").rglob("*") if p.is_file()}
    packed = {n for n in names if n.startswith("kveval/")}
    assert packed == shipped, {"missing": sorted(shipped - packed), "extra": sorted(packed - shipped)}


def test_installed_kveval_comes_from_the_new_venv(venv, tmp_path):
    proc = _run([venv / "bin" / "python", "-c", "import kveval, sys; print(kveval.__file__)"], cwd=tmp_path)
    assert proc.returncode == 0, _show(proc)
    where = Path(proc.stdout.strip())
    assert _inside(where, venv) and not _inside(where, REPO), _show(proc)


def test_tasks_path_points_into_the_new_venv(venv, tmp_path):
    proc = _run([venv / "bin" / "kveval", "tasks", "path"], cwd=tmp_path)
    assert proc.returncode == 0, _show(proc)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, _show(proc)
    path = Path(lines[0])
    assert path.is_absolute() and path.is_dir(), _show(proc)
    assert _inside(path, venv) and not _inside(path, REPO), _show(proc)
    assert (path / "kveval_longctx.yaml").is_file() and (path / "utils.py").is_file(), sorted(os.listdir(path))


def test_tasks_generate_writes_data(venv, tmp_path, default_model_dir):
    out = tmp_path / "taskdata"
    proc = _run([venv / "bin" / "kveval", "tasks", "generate", "--model", default_model_dir,
                 "--max-model-len", "512", "--out", out], cwd=tmp_path)
    assert proc.returncode == 0, _show(proc)
    files = sorted(out.glob("*.jsonl"))
    assert files, _show(proc)
    assert all(f.stat().st_size > 0 for f in files), [(f.name, f.stat().st_size) for f in files]


def test_report_rewrites_a_stored_run(venv, tmp_path):
    if not (DEMO_RUN / "manifest.json").is_file():
        pytest.skip(f"no stored run at {DEMO_RUN}")
    run_dir = tmp_path / "cpu-demo"
    shutil.copytree(DEMO_RUN, run_dir, symlinks=True)
    review = run_dir / "review.md"
    review.unlink(missing_ok=True)
    proc = _run([venv / "bin" / "kveval", "report", run_dir], cwd=tmp_path)
    assert proc.returncode in VERDICT_CODES, _show(proc)
    assert review.is_file() and review.stat().st_size > 0, _show(proc)

"""One live run per run directory (files/run_lock.py), and writes that survive a full disk
(files/rundir.write_bytes_atomic): the previous version stays, and DiskFull names the mount and file."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from kveval.files import rundir
from kveval.files.run_lock import LOCK_NAME, RunDirBusy, acquire, live_writer
from kveval.files.rundir import DiskFull, RunDir, mount_point, write_json_atomic, write_text_atomic

HOLD = ("import sys, time; from pathlib import Path; from kveval.files.run_lock import acquire; "
        "acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")


def _holder(run_dir):
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_lock_is_refused_naming_the_holder_and_a_dead_holder_blocks_nothing(tmp_path):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        with pytest.raises(RunDirBusy) as refused:
            acquire(run_dir)
        assert f"pid {holder.pid}:" in str(refused.value) and "another kveval run" in str(refused.value)
        assert live_writer(run_dir).startswith(f"pid {holder.pid}:")
    finally:
        holder.kill()   # SIGKILL: no clean-up runs, the kernel drops the lock
        holder.wait()
    assert live_writer(run_dir) is None
    lock = acquire(run_dir)   # a resume after a killed run is not blocked
    assert live_writer(run_dir) is None   # this process's own lock is no other run
    lock.release()


def test_a_refused_run_leaves_no_directory_behind(tmp_path):
    lock = acquire(tmp_path / "new")
    assert (tmp_path / "new" / LOCK_NAME).is_file()
    lock.discard()
    assert not (tmp_path / "new").exists()
    kept = acquire(tmp_path)   # a directory that was there stays
    kept.discard()
    assert tmp_path.is_dir()


def test_a_full_disk_keeps_the_previous_version_and_names_mount_and_file(tmp_path, monkeypatch):
    path = tmp_path / "cells" / "auto-1024.json"
    write_json_atomic(path, {"complete": True, "v": 1})

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "fsync", no_space)
    with pytest.raises(DiskFull) as full:
        write_json_atomic(path, {"complete": True, "v": 2})
    assert str(full.value) == f"no space left on {mount_point(tmp_path)} while writing {path}"
    assert rundir.read_json(path) == {"complete": True, "v": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["auto-1024.json"]   # no temp file left
    monkeypatch.undo()
    write_text_atomic(tmp_path / "cells" / "other.json", '{"complete": false}')
    assert RunDir(tmp_path).finished_cell_count() == 1


def test_other_write_errors_stay_what_they_are(tmp_path, monkeypatch):
    def denied(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(rundir.os, "fsync", denied)
    with pytest.raises(OSError) as error:
        write_json_atomic(tmp_path / "x.json", {})
    assert not isinstance(error.value, DiskFull) and error.value.errno == errno.EIO


def test_mount_point_of_a_path_not_yet_made():
    assert mount_point("/proc/self/nothing/here") == mount_point("/proc")
    assert os.path.ismount(mount_point("/tmp/kveval-no-such-dir/x"))


def test_report_and_gate_say_a_run_is_still_writing(tmp_path):
    from click.testing import CliRunner

    from kveval.cli.commands import cli

    holder = _holder(tmp_path / "run")
    try:
        outcome = CliRunner().invoke(cli, ["gate", str(tmp_path / "run")])
    finally:
        holder.kill()
        holder.wait()
    assert f"a run is still writing {tmp_path / 'run'} (pid {holder.pid}:" in outcome.output
    assert outcome.exit_code == 2   # and then: no manifest there yet, one clear line
    assert "Traceback" not in outcome.output

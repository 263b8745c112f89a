"""Output paths are tried for real before any work, and every message names the user's path.

Root passes ``os.access`` on ``/proc`` and ``/sys``; a fresh-clone trial found ``--out
/proc/x`` refused only after the whole simulation, naming the internal staging folder
(``/proc/.x.staging-...``), and ``export --png /proc/x.png`` naming ``/proc/.tmp-...``.
"""

from __future__ import annotations

import errno
import os

import pytest

from harness.logs import writer
from harness.logs.outputs import paths
from harness.logs.outputs.paths import OutputPathError, RunFolder, check_output_dir, check_output_file

from tests.cli.test_cli_error_contract import DEFAULT, TRACE, run_error

NO_FILES_HERE = [p for p in ("/proc", "/sys") if os.path.isdir(p)]


def _no_simulation(monkeypatch):
    import simulators.run

    def refuse(*a, **k):
        raise AssertionError("the output path must be checked before the simulation starts")

    monkeypatch.setattr(simulators.run, "simulate", refuse)


@pytest.mark.skipif(not NO_FILES_HERE, reason="no /proc or /sys on this system")
@pytest.mark.parametrize("root", NO_FILES_HERE)
def test_pseudo_filesystems_are_refused_before_simulating(root, capsys, monkeypatch):
    _no_simulation(monkeypatch)
    line = run_error(
        ["simulate", DEFAULT, "--out", f"{root}/x", "--no-png"], capsys, f"--out {root}/x", "cannot write there"
    )
    assert "staging" not in line and ".tmp" not in line


@pytest.mark.skipif(not NO_FILES_HERE, reason="no /proc or /sys on this system")
@pytest.mark.parametrize(
    "argv,arg",
    [
        (["export", TRACE, "--png", "{root}/x.png"], "--png"),
        (["export", TRACE, "--perfetto", "{root}/x.json"], "--perfetto"),
        (["replay", TRACE, "--out", "{root}/deep/er/x.jsonl"], "--out"),
        (["calibrate", "refit", "--quick", "--out", "{root}/cal.json"], "--out"),
        (["fuzz", "--seeds", "1", "--workers", "1", "--out", "{root}/fz"], "--out"),
    ],
)
def test_every_output_argument_is_tried_for_real(argv, arg, capsys):
    root = NO_FILES_HERE[0]
    argv = [a.format(root=root) for a in argv]
    line = run_error(argv, capsys, arg, argv[-1], "cannot write there")
    assert ".tmp" not in line and "probe" not in line


def test_the_probe_leaves_nothing_behind(tmp_path):
    check_output_file(str(tmp_path / "a" / "b.json"), "--out")
    check_output_dir(str(tmp_path / "run"), ["events.jsonl"], "--out")
    assert os.listdir(tmp_path) == []


def test_a_folder_that_refuses_files_is_found_by_trying(tmp_path, monkeypatch):
    """A place whose permission bits say yes but that takes no file (a read-only mount,
    a pseudo file system) is refused: the check creates a file, it does not trust bits."""

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".rlharness-probe-x"))

    monkeypatch.setattr(paths.tempfile, "mkstemp", refuse)
    with pytest.raises(OutputPathError) as e:
        check_output_file(str(tmp_path / "x.json"), "--out")
    assert (
        str(e.value)
        == f"--out {tmp_path / 'x.json'}: cannot write there (no file can be created in {tmp_path}: Read-only file system)"
    )


def test_a_write_that_fails_late_names_the_users_file(tmp_path, monkeypatch):
    target = tmp_path / "x.png"

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", src)

    monkeypatch.setattr(writer.os, "replace", full)
    with pytest.raises(OSError) as e:
        writer.atomic_write(str(target), b"data")
    assert e.value.filename == str(target) and e.value.strerror == "No space left on device"
    assert os.listdir(tmp_path) == []  # the temp file is gone too


def test_a_run_folder_failure_names_the_users_folder(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(OSError) as e:
        with RunFolder(str(out), owned=("events.jsonl",)) as folder:
            staged = folder.path("events.jsonl")
            raise OSError(errno.ENOSPC, "No space left on device", staged)
    assert e.value.filename == str(out)
    assert os.listdir(tmp_path) == []


def test_cli_reports_a_late_write_failure_with_the_users_path(tmp_path, capsys, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", src)

    monkeypatch.setattr(writer.os, "replace", full)
    png = tmp_path / "x.png"
    line = run_error(["export", TRACE, "--png", str(png)], capsys, str(png), "No space left on device")
    assert ".tmp" not in line
    assert os.listdir(tmp_path) == []

"""Private run folders (gpu_gates/transports/private_dirs.py): the last live member removes the
folder even when another member was SIGKILLed; the sweep removes only what a process
that is gone owned; the leak guard (tests/leak_guard.py) fails a session that leaves a
tagged file behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from gpu_gates.transports import private_dirs

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

MEMBER = textwrap.dedent("""
    import os, signal, sys
    from gpu_gates.transports import private_dirs
    folder = private_dirs.RunFolder(sys.argv[1], owned=True).join()
    open(os.path.join(sys.argv[1], "peer.sock"), "w").close()  # what a rank leaves when killed
    print("joined", flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.readline()
    print("removed" if folder.leave() else "kept", flush=True)
""")


def _member(path: str, mode: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", MEMBER, path, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert child.stdout.readline().strip() == "joined"
    return child


def test_the_last_member_out_removes_the_folder_a_killed_member_left_files_in(tmp_path):
    path = str(tmp_path / private_dirs.folder_name(os.getpid(), "run"))
    folder = private_dirs.RunFolder(path, owned=True).join()
    killed = _member(path, "kill")
    assert killed.wait(timeout=30) == -signal.SIGKILL
    assert os.path.exists(os.path.join(path, "peer.sock"))
    assert folder.leave() is True
    assert not os.path.exists(path)


def test_a_live_member_keeps_the_folder_until_it_leaves_itself(tmp_path):
    path = str(tmp_path / private_dirs.folder_name(os.getpid(), "run"))
    folder = private_dirs.RunFolder(path, owned=True).join()
    peer = _member(path, "stay")
    try:
        assert folder.leave() is False and os.path.isdir(path)
        out, _ = peer.communicate("\n", timeout=30)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
    assert out.strip() == "removed" and not os.path.exists(path)


def test_a_launcher_owned_folder_is_never_removed_by_a_member(tmp_path):
    path = str(tmp_path / "given")
    folder = private_dirs.RunFolder(path, owned=False).join()
    assert folder.leave() is False and os.path.isdir(path) and os.listdir(path) == []


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_sweep_removes_only_what_a_process_that_is_gone_owned(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    made = {
        "dead folder": tmp_path / f"rlh-{dead}-gate-1234",
        "dead staging": tmp_path / f"{private_dirs.STAGING_PREFIX}{dead}_abc",
        "live folder": tmp_path / f"rlh-{alive}-gate-1234",
        "live staging": tmp_path / f"{private_dirs.STAGING_PREFIX}{alive}_abc",
        "not ours (hex name)": tmp_path / "rlh-012345678901-r2.sock",
        "not ours (other name)": tmp_path / f"other-{dead}-x",
    }
    for key, p in made.items():
        (p.mkdir() if "folder" in key else p.write_text(""))
    (made["dead folder"] / "left.sock").write_text("")
    removed = private_dirs.sweep_stale([str(tmp_path)])
    assert sorted(removed) == sorted(str(made[k]) for k in ("dead folder", "dead staging"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        made[k].name for k in ("live folder", "live staging", "not ours (hex name)", "not ours (other name)")
    )


LEAKY_TEST = textwrap.dedent("""
    import os
    from gpu_gates.transports import private_dirs

    def test_makes_a_folder():
        path = private_dirs.make_private("leak", private_dirs.shm_base())
        print("MADE", path)
        if os.environ.get("CLEAN") == "1":
            private_dirs.remove(path)
""")


def _nested_session(tmp_path, clean: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_leaky.py").write_text(LEAKY_TEST)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.leak_guard",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path / "test_leaky.py"),
        ],
        cwd=tmp_path,
        env={**ENV, "CLEAN": clean},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_leak_guard_fails_a_session_that_left_a_tagged_folder(tmp_path):
    run = _nested_session(tmp_path, "0")
    made = next(line.split()[-1] for line in run.stdout.splitlines() if "MADE" in line)
    try:
        assert run.returncode == 1, run.stdout[-2000:]
        assert "files left behind" in run.stdout and made in run.stdout
        assert "1 passed" in run.stdout  # the test itself passed: the guard failed the session
    finally:
        private_dirs.remove(made)


def test_the_leak_guard_passes_a_session_that_cleaned_up(tmp_path):
    run = _nested_session(tmp_path, "1")
    assert run.returncode == 0, run.stdout[-2000:]
    assert "files left behind" not in run.stdout

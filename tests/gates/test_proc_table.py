"""The orphan searches of the gate tests find a live process, and stop finding it once it
has ended (a check that could never fire would pass every gate run)."""

import subprocess
import sys
import uuid

from tests.gates.proc_table import pids_in_session, pids_mentioning


def test_a_live_process_is_found_by_its_command_line_and_its_session():
    marker = f"rlharness-proc-table-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker], start_new_session=True)
    try:
        assert pids_mentioning(marker) == [proc.pid]
        # membership, not equality: pids wrap (pid_max is 32,768 on the CI machine), so a
        # survivor of an older session whose leader had this pid is in "session pid" too
        assert proc.pid in pids_in_session(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert pids_mentioning(marker) == []
    assert proc.pid not in pids_in_session(proc.pid)

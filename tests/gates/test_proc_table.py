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
        assert pids_in_session(proc.pid) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert pids_mentioning(marker) == []
    assert pids_in_session(proc.pid) == []

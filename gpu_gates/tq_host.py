"""Host TransferQueue for a gate launch: start Ray + TQ here, run the gate, tear down.

    python gpu_gates/tq_host.py [--timeout 600] [--startup-timeout 180] -- \\
        torchrun --nproc-per-node 4 gpu_gates/dataplane_writeback.py --store transferqueue

The *launcher* is the one Ray driver: it starts a local Ray (more logical CPUs than cores,
because TQ's controller and each storage unit reserve one and its init otherwise waits
forever) and TransferQueue's controller plus one simple-storage unit, writes TQ's client
config (controller and storage ZMQ addresses) owner-only into a private temporary
directory, and runs the command with ``RLHARNESS_TQ_CLIENT_CONF`` naming that file. The
ranks attach as plain TQ clients over ZMQ (``TransferQueueStore.attach``): no rank starts
or joins Ray. Every wait is bounded; on every exit path TQ and Ray are shut down and the
directory is removed. Exit code: the command's, 2 for usage, 1 when TQ did not start or
the command ran past ``--timeout`` (its process group is killed).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import List, Optional  # noqa: E402

CONF_ENV = "RLHARNESS_TQ_CLIENT_CONF"


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tq_host.py", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the command may run")
    parser.add_argument("--startup-timeout", type=float, default=180.0, help="seconds Ray + TQ may take to start")
    parser.add_argument("--num-cpus", type=int, default=8, help="Ray's logical CPUs (>= 2: controller + storage unit)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run (torchrun ...)")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("command: nothing to run (give it after --)")
    if args.num_cpus < 2:
        parser.error(f"--num-cpus: {args.num_cpus} leaves TQ's controller or storage unit without a CPU (need >= 2)")
    return args


def _run_bounded(command: List[str], env: dict, timeout: float) -> int:
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"tq_host: the command ran past --timeout {timeout:g} s; killing its process group", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 1
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    import ray

    from gpu_gates.transports.tq_store import TransferQueueStore

    workdir = tempfile.mkdtemp(prefix="rlharness-tq-")
    store = None
    started = time.monotonic()
    try:
        # worker_niceness 0: TransferQueue's actors serve the command's ranks, so they must
        # not run at Ray's default nice 15 (starved beside busy ranks: docs/gates.md)
        ray.init(
            num_cpus=args.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            namespace="rlharness-tq-host",
            configure_logging=False,
            _system_config={"worker_niceness": 0},
        )
        try:
            store = TransferQueueStore.start(num_storage_units=1, timeout_s=args.startup_timeout)
        except Exception as exc:  # one line, not a traceback: the gate never ran
            print(f"tq_host: TransferQueue did not start: {exc}", file=sys.stderr)
            return 1
        conf_path = os.path.join(workdir, "client_conf.pkl")
        store.write_client_config(conf_path)
        print(f"tq_host: Ray + TransferQueue up in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
        ran = time.monotonic()
        rc = _run_bounded(args.command, {**os.environ, CONF_ENV: conf_path}, args.timeout)
        print(f"tq_host: command exited {rc} after {time.monotonic() - ran:.1f} s", file=sys.stderr, flush=True)
        return rc
    finally:
        down = time.monotonic()
        try:
            if store is not None:
                store.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"tq_host: TransferQueue and Ray shut down in {time.monotonic() - down:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

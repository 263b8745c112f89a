"""The teardown gate's peer-died case: after a peer process died, does tearing the process
group down return, with ``destroy_process_group`` and with ``abort``?

    python -m gpu_gates.teardown.peer_died [--backend gloo|nccl] [--mode destroy|abort|both]

sgl-project/SpecForge #781: ``dist.destroy_process_group()`` hung after a peer died (a
collective destroy needs every member); the fix aborts the group instead. Two ranks start
(each its own process, not torchrun: torchrun's agent would tear the survivor down when its
peer dies); rank 1 leaves after one all-reduce without any teardown (``os._exit``); rank 0
then issues a collective (which must fail, not hang, within the group's timeout) and tears
the group down with the chosen call on a thread it waits for at most ``--deadline-s``. A
teardown that does not return in time is the gate's finding, named with its mode; the
parent kills every child it started, so the gate itself never hangs. On gloo both calls
return (gloo's destroy does not wait for peers; the report says so); NCCL is where #781's
destroy waits, and ``--backend nccl`` runs the same case on two GPUs.

Test hook ``--hook hang_teardown``: the teardown blocks forever, so the check must fire.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

MODES = ("destroy", "abort")


def _teardown(mode: str, hook: Optional[str]) -> None:
    import torch.distributed as dist

    if hook == "hang_teardown":  # the check's firing test: a teardown that never returns
        threading.Event().wait()
    if mode == "destroy":
        dist.destroy_process_group()
    else:
        dist.distributed_c10d._abort_process_group()  # what ProcessGroup.abort() does for the default group


def _rank(rank: int, init: str, backend: str, mode: str, deadline_s: float, hook: Optional[str], out: Any) -> None:
    """One rank; rank 0 sends its report on the pipe ``out`` and leaves with ``os._exit`` either way
    (a hung teardown thread must not keep the process alive)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=deadline_s))
    dist.all_reduce(torch.ones(1, device=device))
    if rank == 1:
        os._exit(0)  # the peer dies: no teardown, no goodbye
    report: Dict[str, Any] = {"mode": mode, "backend": backend}
    time.sleep(0.2)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1, device=device))
        if backend == "nccl":
            torch.cuda.synchronize(device)
        report["collective"] = "returned"
    except Exception as exc:  # the expected outcome: the peer is gone
        report["collective"] = f"raised {type(exc).__name__}: {str(exc)[:160]}"
    report["collective_s"] = round(time.monotonic() - start, 3)
    done = threading.Event()
    errors: List[str] = []

    def teardown() -> None:
        try:
            _teardown(mode, hook)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
        done.set()

    start = time.monotonic()
    threading.Thread(target=teardown, daemon=True).start()
    report["teardown_returned"] = done.wait(deadline_s)
    report["teardown_s"] = round(time.monotonic() - start, 3)
    if errors:
        report["teardown_error"] = errors[0]
    out.send(report)  # a pipe's send is synchronous: nothing is lost to the exit below
    os._exit(0)


def _fresh_process_context() -> Any:
    """Where the rank processes come from: forks of multiprocessing's fork server, a
    single-threaded process of its own that has imported torch and nothing else (no CUDA
    initialized, so a rank may still choose its GPU), started at the first case and shared
    by the later ones; each rank still starts with none of the caller's state. A rank
    spawned afresh imports torch itself (about 1.3 CPU s each, two per case). Where there
    is no fork server, spawned."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed"])
    return ctx


def run_case(mode: str, backend: str = "gloo", deadline_s: float = 10.0, hook: Optional[str] = None) -> Dict[str, Any]:
    """Run one peer-died case in two fresh processes; never longer than about twice the
    deadline (the children are killed past it)."""
    ctx = _fresh_process_context()
    reports, out = ctx.Pipe(duplex=False)
    with tempfile.TemporaryDirectory(prefix="peer-died-") as tmp:
        init = "file://" + os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_rank, args=(r, init, backend, mode, deadline_s, hook, out), daemon=True) for r in (0, 1)
        ]
        for p in procs:
            p.start()
        if reports.poll(3 * deadline_s + 30):  # start-up (imports) + collective + teardown
            report = reports.recv()
        else:
            report = {
                "mode": mode,
                "backend": backend,
                "teardown_returned": False,
                "error": "rank 0 sent no report (killed past the deadline)",
            }
        for p in procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
    report["ok"] = bool(report.get("teardown_returned")) and report.get("collective") != "returned"
    if not report.get("teardown_returned"):
        report["finding"] = (
            f"{mode} did not return within {deadline_s:g} s after a peer died (sgl-project/SpecForge #781)"
        )
    elif report.get("collective") == "returned":
        report["finding"] = "a collective with a dead peer returned as if it had completed"
    return report


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_gates.teardown.peer_died", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--mode", choices=MODES + ("both",), default="both")
    parser.add_argument("--deadline-s", type=float, default=10.0)
    parser.add_argument("--hook", choices=("hang_teardown",), default=None)
    args = parser.parse_args(argv)
    if args.deadline_s <= 0:
        print("error: --deadline-s: must be positive", file=sys.stderr)
        return 2
    reports = [
        run_case(m, args.backend, args.deadline_s, args.hook) for m in (MODES if args.mode == "both" else (args.mode,))
    ]
    print(json.dumps({"gate": "teardown_peer_died", "cases": reports}, indent=1))
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Measure the real refit stream on this machine: a sender here, a receiver process beside it.

Used by ``rlharness calibrate refit`` / ``fidelity refit`` (rlharness/refit_calibrate.py) and the
benchmark. One receiver process serves every configuration of a run (importing torch
costs seconds on a loaded machine), driven by JSON lines on its stdin:

    parent -> peer: {"step": s, "specs": [[name, shape, dtype, nbytes], ...], "budget": b}
    peer -> parent: "ready <s>"            (weights allocated and touched, socket connected)
    ...             the stream runs over the ipc:// socket ...
    peer -> parent: {"step": s, "wall_s": ..., "load_s": [...], "load_intervals": [...]}

The peer exits on EOF, on a bad line, or when a stream fails (its error goes to the
parent as ``{"error": ...}``); the parent kills it on every exit path and removes the
socket's private folder. Weights on both sides are allocated and written before the
stream starts, so page faults of fresh memory are not measured as transfer (measured
here: fresh receiver memory halves the figures).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from gpu_gates.transports import private_dirs
from gpu_gates.transports import zmq_stream as zs
from harness.refit import stream as proto
from gpu_gates.sync.bucket_cache import build_buckets, dtype_from_name

MiB = 1 << 20


def synthetic_specs(total_bytes: int, layers: int = 6) -> List[proto.TensorSpec]:
    """A transformer-shaped list of bf16 tensors of about ``total_bytes``: an embedding
    (a tenth of the model: oversized for small buffers, as DeepSeek-V3's is in NeMo RL),
    then per layer qkv, o, up, down and two norms. Deterministic."""
    elem = 2
    # embedding = 0.1 total; each layer = 3h^2 + h^2 + 4h^2 + 4h^2 + 2h elements = 12h^2 + 2h
    h = max(8, int(math.sqrt(0.9 * total_bytes / elem / (12 * layers))))
    vocab = max(8, int(0.1 * total_bytes / elem / h))
    specs = [proto.TensorSpec("embed", (vocab, h), "bfloat16", vocab * h * elem)]
    for i in range(layers):
        for name, shape in (
            ("qkv", (3 * h, h)),
            ("o", (h, h)),
            ("up", (4 * h, h)),
            ("down", (h, 4 * h)),
            ("ln1", (h,)),
            ("ln2", (h,)),
        ):
            specs.append(proto.TensorSpec(f"l{i}.{name}", shape, "bfloat16", math.prod(shape) * elem))
    return specs


def materialize(specs: Sequence[proto.TensorSpec], seed: int) -> List[Tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(s.name, torch.randn(s.shape, generator=g).to(dtype_from_name(s.dtype))) for s in specs]


@dataclass
class Measurement:
    """One configuration measured ``repeats`` times (best-of and median, plus per-group detail)."""

    model_bytes: int
    budget_bytes: int
    groups: int
    tensors: int
    wall_s: List[float] = field(default_factory=list)
    staging_s: List[float] = field(default_factory=list)
    dedicated_s: List[float] = field(default_factory=list)
    dedicated_bytes: int = 0
    cache_build_s: List[float] = field(default_factory=list)
    pack_s: List[float] = field(default_factory=list)  # per repeat: the sender's packing, all groups
    load_s: List[float] = field(default_factory=list)  # per repeat: the receiver's loading, all groups
    overlap_s: List[float] = field(default_factory=list)
    ack_wait_s: List[float] = field(default_factory=list)  # per repeat: the sender waiting for ACKs, all groups

    @property
    def best_s(self) -> float:
        return min(self.wall_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    def to_json(self) -> dict:
        return {
            "model_bytes": self.model_bytes,
            "budget_bytes": self.budget_bytes,
            "groups": self.groups,
            "tensors": self.tensors,
            "wall_s": self.wall_s,
            "staging_s": self.staging_s,
            "dedicated_s": self.dedicated_s,
            "dedicated_bytes": self.dedicated_bytes,
            "cache_build_s": self.cache_build_s,
            "pack_s": self.pack_s,
            "load_s": self.load_s,
            "overlap_s": self.overlap_s,
        }


class StreamBench:
    """A bound sender plus its receiver process; ``measure()`` runs one configuration."""

    def __init__(self, timeout_s: float = 60.0, single_buffer: bool = False) -> None:
        private_dirs.sweep_stale()  # what earlier runs killed whole left
        self.dir = private_dirs.make_private("refit")  # the socket's folder: removed by close(), the peer's fate aside
        self.endpoint = f"ipc://{self.dir}/refit.sock"
        self.timeout_s = timeout_s
        self.peer: Optional[subprocess.Popen] = None
        self.sender: Optional[zs.RefitSender] = None
        self.step = 0
        # One thread per side: the copies are memory-bound, and idle OpenMP workers spin-wait,
        # which on a small machine steals the core the other side is copying on.
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self.sender = zs.RefitSender(
                self.endpoint, peer="measure-peer", timeout_s=timeout_s, single_buffer=single_buffer
            )
            self.peer = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpu_gates.transports.measure",
                    "--peer",
                    self.endpoint,
                    "--timeout",
                    str(timeout_s),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "StreamBench":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.peer is not None:
            try:
                self.peer.stdin.close()
                self.peer.wait(timeout=5)
            except Exception:
                pass
            if self.peer.poll() is None:
                self.peer.kill()
                self.peer.wait()
            self.peer = None
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        private_dirs.remove(self.dir)
        torch.set_num_threads(self._threads)

    def _line(self) -> str:
        line = self.peer.stdout.readline()
        if not line:
            raise RuntimeError(f"refit measurement peer exited (code {self.peer.poll()})")
        return line.strip()

    def measure(
        self,
        specs: Sequence[proto.TensorSpec],
        budget_bytes: int,
        repeats: int = 3,
        seed: int = 0,
        cache_bucket_bytes: Optional[int] = None,
        into: Optional[Measurement] = None,
        named: Optional[List[Tuple[str, torch.Tensor]]] = None,
        warmup: int = 0,
    ) -> Measurement:
        """Run one configuration ``repeats`` times (appending to ``into`` if given, so callers
        can interleave configurations and spread a burst of load over all of them).
        ``warmup`` syncs run first and are not recorded: after another configuration they
        re-size the pooled staging buffers and the receiver's mappings, so what is recorded
        is the steady state of repeated syncs (what the simulator models)."""
        named = named if named is not None else materialize(specs, seed)
        m = into if into is not None else Measurement(sum(s.nbytes for s in specs), budget_bytes, 0, len(specs))
        for i in range(warmup + repeats):
            res, peer = self._sync(
                specs, budget_bytes, named, m if i >= warmup and cache_bucket_bytes else None, cache_bucket_bytes
            )
            if i < warmup:
                continue
            m.groups = res.groups
            m.wall_s.append(res.wall_s)
            m.staging_s.append(res.staging_s)
            m.dedicated_s.append(res.dedicated_s)
            m.dedicated_bytes = res.dedicated_bytes
            m.pack_s.append(sum(t.pack_s for t in res.timings))
            m.ack_wait_s.append(sum(t.ack_wait_s for t in res.timings) + res.complete_s)
            m.load_s.append(sum(peer["load_s"]))
            m.overlap_s.append(
                zs.overlap_seconds([t.pack_interval for t in res.timings], [tuple(x) for x in peer["load_intervals"]])
            )
        return m

    def _sync(self, specs, budget_bytes: int, named, m: Optional[Measurement], cache_bucket_bytes: Optional[int]):
        """One sync with the peer; with ``m``, the cache build it precedes is timed into it."""
        self.step += 1
        if m is not None:
            t = time.perf_counter()
            build_buckets(named, cache_bucket_bytes)
            m.cache_build_s.append(time.perf_counter() - t)
        cmd = {
            "step": self.step,
            "budget": budget_bytes,
            "specs": [[s.name, list(s.shape), s.dtype, s.nbytes] for s in specs],
        }
        self.peer.stdin.write(json.dumps(cmd) + "\n")
        self.peer.stdin.flush()
        ready = self._line()
        if ready != f"ready {self.step}":
            raise RuntimeError(f"refit measurement peer: expected 'ready {self.step}', got {ready!r}")
        res = self.sender.stream(named, budget_bytes, step=self.step)
        peer = json.loads(self._line())
        if "error" in peer:
            raise RuntimeError(f"refit measurement peer failed: {peer['error']}")
        return res, peer


def _peer(endpoint: str, timeout_s: float) -> int:
    torch.set_num_threads(1)  # see StreamBench: one core per side, no OpenMP spin-waits stealing the other's
    receiver = zs.RefitReceiver(endpoint, peer="measure-sender", timeout_s=timeout_s)
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            specs = [proto.TensorSpec(n, tuple(shape), dt, nb) for n, shape, dt, nb in cmd["specs"]]
            weights = {s.name: torch.zeros(s.shape, dtype=dtype_from_name(s.dtype)) for s in specs}  # touched
            print(f"ready {cmd['step']}", flush=True)
            try:
                res = receiver.receive(
                    proto.manifest_of(specs),
                    zs.copy_into(weights),
                    step=cmd["step"],
                    half_bytes=proto.half_buffer_bytes(cmd["budget"]),
                )
            except Exception as exc:
                print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
                return 1
            print(
                json.dumps(
                    {"step": res.step, "wall_s": res.wall_s, "load_s": res.load_s, "load_intervals": res.load_intervals}
                ),
                flush=True,
            )
    finally:
        receiver.close()
    return 0


def _copy_worker(nbytes: int, rounds: int, start, out) -> None:
    torch.set_num_threads(1)
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    start.wait()
    t = time.perf_counter()
    for _ in range(rounds):
        dst.copy_(src)
    out.put(time.perf_counter() - t)


def parallel_copy_speedup(nbytes: int = 16 << 20, rounds: int = 16) -> Tuple[float, float]:
    """How much parallelism this machine gives two copying processes right now: the
    seconds one process takes for ``rounds`` copies alone, and the speedup of two such
    processes side by side (2.0 = two free cores and memory bandwidth to spare; 1.0 = in
    effect one core, where a sender and a receiver cannot overlap at all)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")

    def run(n: int) -> List[float]:
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_copy_worker, args=(nbytes, rounds, start, out)) for _ in range(n)]
        for p in procs:
            p.start()
        time.sleep(0.3)  # both allocated and touched before the clock starts
        start.set()
        t = time.perf_counter()
        times = [out.get(timeout=120) for _ in procs]
        wall = time.perf_counter() - t
        for p in procs:
            p.join()
        return [wall] + times

    alone = run(1)[0]
    together = run(2)[0]
    return alone, 2 * alone / together if together > 0 else 0.0


def memcpy_seconds(nbytes: int, repeats: int = 3) -> float:
    """Best-of time of one plain copy of ``nbytes`` between two touched CPU buffers."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return best


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="refit stream measurement peer (started by StreamBench)")
    ap.add_argument("--peer", required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    sys.exit(_peer(a.peer, a.timeout))

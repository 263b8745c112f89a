"""Refit stream bandwidth on this machine (a printed benchmark, not a test).

In one run, for the same bytes (a model of equal-sized bf16 tensors, so packing a group
and loading it cost about the same — the case ping-pong is for):

* ping-pong: the real stream (harness/refit/zmq_stream.py: pyzmq REQ/REP on ipc://, two
  /dev/shm staging buffers, a receiver process), the sender packing group g+1 while the
  receiver loads group g;
* single buffer: the same stream with every ACK collected before the next group is
  packed (no overlap) — what gpu_gates/ipc.py did per bucket;
* raw memcpy: one copy of the same number of bytes between two touched buffers.

Each figure is the median of --repeats runs (configurations interleaved; the machine may
be shared). The last lines set each target against its figure:
  * ping-pong faster than single-buffer when pack and load times are comparable;
  * ping-pong >= 50 % of raw memcpy bandwidth for large buffers on CPU.

    python benchmarks/refit_stream.py [--model-mib 64] [--budget-mib 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.refit import stream as proto  # noqa: E402
from harness.refit.measure import Measurement, StreamBench, materialize, memcpy_seconds  # noqa: E402

MiB = 1 << 20


def equal_tensors(model_bytes: int, tensor_bytes: int):
    n = max(1, model_bytes // tensor_bytes)
    elems = tensor_bytes // 2
    return [proto.TensorSpec(f"w{i}", (elems,), "bfloat16", elems * 2) for i in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-mib", type=int, default=64)
    ap.add_argument("--budget-mib", type=int, default=32, help="two buffers of half each")
    ap.add_argument("--tensor-mib", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    specs = equal_tensors(args.model_mib * MiB, int(args.tensor_mib * MiB))
    total = sum(s.nbytes for s in specs)
    budget = args.budget_mib * MiB
    named = materialize(specs, 0)
    runs = {"ping-pong": Measurement(total, budget, 0, len(specs)),
            "single buffer": Measurement(total, budget, 0, len(specs))}
    memcpy = []
    with StreamBench() as pingpong, StreamBench(single_buffer=True) as single:
        for _ in range(args.repeats + 1):  # the first round allocates the pooled buffers: dropped below
            pingpong.measure(specs, budget, repeats=1, into=runs["ping-pong"], named=named)
            single.measure(specs, budget, repeats=1, into=runs["single buffer"], named=named)
            memcpy.append(memcpy_seconds(total, repeats=1))
    for m in runs.values():
        m.wall_s = m.wall_s[1:]
    memcpy = memcpy[1:]
    rate = {name: total / m.median_s for name, m in runs.items()}
    rate["raw memcpy"] = total / statistics.median(memcpy)
    groups = runs["ping-pong"].groups
    pack = statistics.median(runs["ping-pong"].pack_s[1:]) / max(groups, 1)
    load = statistics.median(runs["ping-pong"].load_s[1:]) / max(groups, 1)
    overlap = statistics.median(runs["ping-pong"].overlap_s[1:])
    print(f"refit stream: {total / MiB:.0f} MiB in {len(specs)} bf16 tensors of {args.tensor_mib:g} MiB, "
          f"budget {args.budget_mib} MiB (half {proto.half_buffer_bytes(budget) / MiB:g} MiB), {groups} groups, "
          f"median of {args.repeats}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'variant':14s} {'GB/s':>7s} {'ms':>8s}")
    for name in ("ping-pong", "single buffer", "raw memcpy"):
        print(f"{name:14s} {rate[name] / 1e9:7.2f} {total / rate[name] * 1e3:8.1f}")
    print(f"per group: pack {pack * 1e3:.2f} ms, load {load * 1e3:.2f} ms (comparable: ratio {pack / load if load else 0:.2f}); "
          f"packing overlapped with loading {overlap * 1e3:.1f} ms per sync")
    speedup = rate["ping-pong"] / rate["single buffer"]
    share = rate["ping-pong"] / rate["raw memcpy"]
    print(f"target: ping-pong faster than single buffer: {speedup:.2f}x -> {'met' if speedup > 1 else 'MISSED'}")
    print(f"target: ping-pong >= 50 % of raw memcpy: {share * 100:.1f} % -> {'met' if share >= 0.5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

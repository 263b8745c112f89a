"""Refit stream bandwidth on this machine (a printed benchmark, not a test).

In one run, for the same bytes (a model of equal-sized bf16 tensors, so packing a group
and loading it cost about the same — the case ping-pong is for):

* ping-pong: the real stream (gpu_gates/transports/zmq_stream.py: pyzmq REQ/REP on ipc://, two
  /dev/shm staging buffers, a receiver process), the sender packing group g+1 while the
  receiver loads group g;
* single buffer: the same stream with every ACK collected before the next group is
  packed (no overlap) — what gpu_gates/sync/ipc.py did per bucket;
* raw memcpy: one copy of the same number of bytes between two touched buffers.

Each figure is the median of --repeats rounds (the variants interleaved, their order
alternating; the machine may be shared). The run also prints the conditions it ran in:
how much two copying processes really run in parallel right now (ping-pong needs the
sender and the receiver on two cores at once), where a sync's time goes (pack, ACK waits,
the rest; receiver load; the overlap), and the best speedup the measured pack and load
times allow. The last lines set each target against its figure:
  * ping-pong faster than single-buffer when pack and load times are comparable;
  * ping-pong >= 50 % of raw memcpy bandwidth for large buffers on CPU.

    python benchmarks/refit_stream.py [--model-mib 64] [--budget-mib 32] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.refit import stream as proto  # noqa: E402
from gpu_gates.transports.measure import (
    Measurement,
    StreamBench,
    materialize,
    memcpy_seconds,  # noqa: E402
    parallel_copy_speedup,
)

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
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    specs = equal_tensors(args.model_mib * MiB, int(args.tensor_mib * MiB))
    total = sum(s.nbytes for s in specs)
    budget = args.budget_mib * MiB
    named = materialize(specs, 0)
    alone_s, parallel = parallel_copy_speedup(int(args.tensor_mib * MiB))
    runs = {
        "ping-pong": Measurement(total, budget, 0, len(specs)),
        "single buffer": Measurement(total, budget, 0, len(specs)),
    }
    memcpy = []
    with StreamBench() as pingpong, StreamBench(single_buffer=True) as single:
        benches = [(pingpong, runs["ping-pong"]), (single, runs["single buffer"])]
        for r in range(args.repeats + 1):  # round 0 allocates the pooled buffers: dropped below
            for bench, m in benches if r % 2 else benches[::-1]:  # alternate who goes first
                bench.measure(specs, budget, repeats=1, into=m, named=named)
            memcpy.append(memcpy_seconds(total, repeats=1))
    for m in runs.values():
        for series in (m.wall_s, m.pack_s, m.load_s, m.overlap_s, m.ack_wait_s):
            del series[0]
    memcpy = memcpy[1:]
    med = statistics.median
    rate = {name: total / m.median_s for name, m in runs.items()}
    rate["raw memcpy"] = total / med(memcpy)
    best = {name: total / m.best_s for name, m in runs.items()}
    best["raw memcpy"] = total / min(memcpy)
    groups = runs["ping-pong"].groups
    alone = runs["single buffer"]  # pack and load each run alone there: their uncontended times
    pack, load = med(alone.pack_s) / max(groups, 1), med(alone.load_s) / max(groups, 1)
    bound_pp = pack + (groups - 1) * max(pack, load) + load
    bound_single = groups * (pack + load)
    print(
        f"refit stream: {total / MiB:.0f} MiB in {len(specs)} bf16 tensors of {args.tensor_mib:g} MiB, "
        f"budget {args.budget_mib} MiB (half {proto.half_buffer_bytes(budget) / MiB:g} MiB), {groups} groups; "
        f"median of {args.repeats} interleaved rounds; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"conditions: two copying processes side by side run {parallel:.2f}x as fast as one "
        f"(2.0 = two free cores; 1.0 = in effect one: then a sender and a receiver cannot overlap)"
    )
    print(f"{'variant':14s} {'GB/s':>7s} {'ms':>8s} {'best GB/s':>10s}")
    for name in ("ping-pong", "single buffer", "raw memcpy"):
        print(f"{name:14s} {rate[name] / 1e9:7.2f} {total / rate[name] * 1e3:8.1f} {best[name] / 1e9:10.2f}")
    for name, m in runs.items():
        wall = m.median_s
        print(
            f"{name} sync, median: pack {med(m.pack_s) * 1e3:.1f} ms ({groups} groups), waiting for ACKs "
            f"{med(m.ack_wait_s) * 1e3:.1f} ms, the rest (headers, sends, protocol) "
            f"{max(0.0, wall - med(m.pack_s) - med(m.ack_wait_s)) * 1e3:.1f} ms; receiver load {med(m.load_s) * 1e3:.1f} ms; "
            f"packing overlapped with loading {med(m.overlap_s) * 1e3:.1f} ms"
        )
    print(
        "copies per byte: 2 in both stream variants (pack into the /dev/shm staging buffer, load out of it; "
        "ZMQ carries only a JSON header, the payload is never pickled nor copied through the socket), 1 in raw memcpy"
    )
    print(
        f"bound from the single-buffer run's pack ({pack * 1e3:.2f} ms/group) and load ({load * 1e3:.2f} ms/group; "
        f"pack/load {pack / load if load else 0:.2f}), each running alone: with two free cores ping-pong takes >= "
        f"{bound_pp * 1e3:.1f} ms against {bound_single * 1e3:.1f} ms, at most {bound_single / bound_pp:.2f}x faster "
        f"and {med(memcpy) / bound_pp * 100:.0f} % of memcpy; with in effect one core, no faster at all"
    )
    speedup = rate["ping-pong"] / rate["single buffer"]
    share = rate["ping-pong"] / rate["raw memcpy"]
    print(
        f"ratio ping-pong / single buffer: {speedup:.2f}x (target > 1 when pack and load are comparable: "
        f"{'met' if speedup > 1 else 'MISSED'})"
    )
    print(
        f"ratio ping-pong / raw memcpy: {share * 100:.1f} % (target >= 50 % for large buffers on CPU: "
        f"{'met' if share >= 0.5 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

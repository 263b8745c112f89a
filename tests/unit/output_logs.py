"""A small simulator-like log for the output tests: training on GPUs 0-7, a generating rank
on 8-15 and 20 with a sync overlapping it on GPU 20 (two lanes), a wake, a sleep and an OOM;
``nodes`` x ``gpn`` GPUs (above 64 the picture is drawn as one image)."""


def dense_log(nodes=9, gpn=8):
    recs = [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "header",
            "schema": "rlharness.eventlog",
            "version": 1,
            "cluster": {"nodes": nodes, "gpus_per_node": gpn},
            "meta": {"scenario": "dense"},
        }
    ]

    def add(t, kind, **f):
        recs.append({"seq": len(recs), "t": float(t), "kind": kind, **f})

    def effect(t0, t1, effect, gpus, args=None):
        common = dict(pipeline_id="p0", effect=effect, args=args or {}, scope="step", step=1, cycle=None, gpus=gpus)
        add(t0, "effect_start", **common)
        add(t1, "effect_end", **common)

    effect(0, 50, "Compute", list(range(8)), {"what": "train"})
    add(0, "rank_state", pipeline_id="p0", dp_rank=0, state="routable", gpus=list(range(8, 16)) + [20])
    effect(40, 60, "SyncFromCache", [20], {"path": "active"})  # overlaps the rank on GPU 20: two lanes
    effect(10, 30, "Wake", [16])
    effect(10, 30, "Sleep", [17])
    add(70, "oom", gpu=40, owner="p0", mem="kv", requested=2, used=1, capacity=2)
    add(100, "rank_state", pipeline_id="p0", dp_rank=0, state="asleep", gpus=list(range(8, 16)) + [20])
    add(100, "sim_end", reason="done", sim_time=100.0, events=1, detail="")
    return recs

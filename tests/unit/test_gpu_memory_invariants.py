"""The GPU-memory invariants on small hand-written logs: vram (capacity, post-sleep residue,
the ledger's own sums), handover (what a GPU still holds when it is granted to another
cluster) and gpu_tenancy (an allocation on a GPU its cluster does not hold)."""

from __future__ import annotations

from harness.logs.invariants import check_log
from tests.unit.invariant_traces import HEAD


def vram(seq, gpu, owner, mem, delta, used):
    return {"seq": seq, "t": seq, "kind": "vram", "gpu": gpu, "owner": owner, "mem": mem, "delta": delta, "used": used}


def test_vram_capacity_residue_and_ledger_consistency():
    cap = 1 << 30
    asleep = {"seq": 4, "t": 4, "kind": "rank_state", "pipeline_id": "p", "dp_rank": 0, "state": "asleep", "gpus": [0]}
    ok = [
        HEAD,
        vram(1, 0, "p/dp0", "weights", 500, 500),
        vram(2, 0, "p/dp0", "kv_cache", 600, 1100),
        vram(3, 0, "p/dp0", "kv_cache", -600, 500),
        vram(4, 0, "p/dp0", "weights", -450, 50),
        dict(asleep, seq=5),
    ]
    assert check_log(ok, ["vram"]) == []
    over = [HEAD, vram(1, 0, "p/train", "train_state", cap + 1, cap + 1)]
    assert "above its capacity" in check_log(over, ["vram"])[0].message
    residue = [HEAD, vram(1, 0, "p/dp0", "nccl", 500, 500), dict(asleep, seq=2)]
    assert "above the post-sleep threshold 100 B" in check_log(residue, ["vram"])[0].message
    lying = [HEAD, vram(1, 0, "p/dp0", "weights", 500, 400)]
    assert "reports 400 B in use" in check_log(lying, ["vram"])[0].message


def handover_trace(residue_kind, residue_owner, nbytes, granted_to="q_actor_train"):
    """p's memory on GPU 0, then GPU 0 is granted to another cluster."""
    v = lambda seq, owner, mem, delta, phase=None: dict(
        {"seq": seq, "t": seq, "kind": "vram", "gpu": 0, "owner": owner, "mem": mem, "delta": delta, "used": 0},
        **({"phase": phase} if phase else {}),
    )
    return [
        {
            "seq": 1,
            "t": 1,
            "kind": "signalled",
            "request_id": 1,
            "waiter": "request",
            "cluster_id": "p_actor_train",
            "priority": "OLD_LOG_PROBS",
            "gpus": [0],
            "cycle": 1,
            "error": None,
        },
        v(2, "p/ctx", "cuda_context", 500),
        v(3, residue_owner, residue_kind, nbytes, "old_log_probs"),
        {"seq": 4, "t": 4, "kind": "released", "cluster_id": "p_actor_train", "gpus": [0], "reason": "release"},
        {
            "seq": 5,
            "t": 5,
            "kind": "signalled",
            "request_id": 2,
            "waiter": "request",
            "cluster_id": granted_to,
            "priority": "ACTOR_TRAINING",
            "gpus": [0],
            "cycle": 2,
            "error": None,
        },
    ]


def test_handover_names_gpu_clusters_bytes_phase_and_the_grant():
    found = check_log(handover_trace("params", "p/train", 1000), ["handover"])
    assert len(found) == 1 and found[0].seq == 5
    assert found[0].message == (
        "GPU 0 granted to q_actor_train (signalled seq 5) still holds p_actor_train's params 1000 B "
        "(1000 B > residue 0 B), left by phase old_log_probs"
    )


def test_handover_allows_contexts_documented_residue_and_the_same_cluster():
    assert check_log(handover_trace("nccl", "p/dp0", 512 << 20), ["handover"]) == []  # <= 1 GiB after sleep
    assert check_log(handover_trace("params", "p/train", 1000, granted_to="p_actor_train"), ["handover"]) == []
    assert check_log(handover_trace("kv_cache", "p/dp0", 2 << 30), ["handover"])  # above the post-sleep threshold


def test_gpu_tenancy_fires_on_an_allocation_where_the_cluster_holds_nothing():
    reg = lambda pid: {
        "seq": 0,
        "t": 0,
        "kind": "register",
        "pipeline_id": pid,
        "cluster_tp_configs": {"actor_train": 1},
        "cluster_device_mappings": {"actor_train": [0]},
    }
    recs = [reg("p"), reg("q")] + handover_trace("params", "p/train", 1000)
    late = dict(recs[4], seq=6, t=6)  # p loads again after it released GPU 0 (now q's)
    found = check_log(recs + [late], ["gpu_tenancy"])
    assert (
        len(found) == 1
        and found[0].message == "p_actor_train allocates params on GPU 0, which is held by q_actor_train"
    )
    assert check_log(recs, ["gpu_tenancy"]) == []
    assert check_log(recs[2:] + [late], ["gpu_tenancy"]) == []  # never registered: holds its GPUs outside the scheduler

"""Each wake and sleep is charged its terms once: the fixed part, and at sleep level 1 the
weights over the host link exactly when the host-RAM ledger says they crossed it.

The reference is the event log alone (each Wake/WakeTags/Sleep effect's start and end, and
the host_ram records of the ranks it moves) plus the scenario's inputs (the fixed parts set
here, the GPU's host link from its datasheet): no formula of the cost model is called. A
term counted twice (the derived ``wake_s`` already holding the copy that the simulator adds
from the ledger) or a copy charged when nothing was on the host fails it.
"""

from __future__ import annotations

import math

import pytest

from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import scenario_from_mapping

A100_HOST_LINK = 25e9  # bytes/s: PCIe Gen4 x16 (NVIDIA A100 datasheet), a100_80gb's pcie_bytes_per_s
WAKE_FIXED, SLEEP_FIXED = 0.5, 0.2
TP = 2


def _scenario(kind: str):
    train = list(range(4)) if kind == "roll_sync" else [0, 1]
    pipe = {
        "name": "p",
        "type": kind,
        "train_gpus": train,
        "infer_gpus": list(range(4)),
        "infer_tp": TP,
        "steps": 2,
        "sleep_level": 1,
        "model": {"preset": "qwen2.5-7b"},
        "workload": {
            "prompts_per_step": 4,
            "generations_per_prompt": 4,
            "prompt_tokens": 64,
            "decode_tokens_median": 64,
            "decode_tokens_max": 256,
        },
    }
    return scenario_from_mapping(
        {
            "name": "s",
            "horizon_s": 5000,
            "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "a100_80gb"},
            "costs": {"wake_fixed_s": WAKE_FIXED, "sleep_fixed_s": SLEEP_FIXED},
            "pipelines": [pipe],
        },
        "t.yaml",
    )


def _charges(records):
    """[(effect, seconds charged, seconds its terms sum to)] for every wake and sleep of the
    log: the terms are the fixed part plus, when the ledger shows the ranks' weights moving
    over the host link during the effect, one copy of a GPU's share of them (every GPU of
    every rank copies at once)."""
    opened, out = {}, []
    for r in records:
        if r["kind"] == "host_ram":  # a rank's weights entering (sleep) or leaving (wake) host RAM
            for state in opened.values():
                if r["owner"] in state["owners"]:
                    state["moved"] = max(state["moved"], abs(r["delta"]))
            continue
        if r["kind"] not in ("effect_start", "effect_end") or r["effect"] not in ("Wake", "WakeTags", "Sleep"):
            continue
        if r["effect"] == "WakeTags" and r["args"].get("tags") == ["kv_cache"]:
            continue  # the KV cache's half of a staged wake moves no weights and takes no time
        key = (r["pipeline_id"], r["effect"], repr(r["args"]))
        if r["kind"] == "effect_start":
            owners = {f"{r['pipeline_id']}/dp{d}" for d in r["args"]["ranks"]}
            opened[key] = {"t": r["t"], "owners": owners, "moved": 0}
            continue
        state = opened.pop(key)
        fixed = SLEEP_FIXED if r["effect"] == "Sleep" else WAKE_FIXED
        out.append((r["effect"], r["t"] - state["t"], fixed + state["moved"] / TP / A100_HOST_LINK))
    return out


@pytest.mark.parametrize("kind", ["roll_sync", "nemo_async"])
def test_every_wake_and_sleep_is_charged_its_terms_once(kind):
    charges = _charges(Simulation(_scenario(kind)).run().records)
    assert {e for e, _, _ in charges} >= {"Sleep"} and any(e.startswith("Wake") for e, _, _ in charges)
    copy = 7.62e9 * 2 / TP / A100_HOST_LINK  # a GPU's share of the 7B's bf16 weights over its host link
    moved = [c for c in charges if c[2] > (SLEEP_FIXED if c[0] == "Sleep" else WAKE_FIXED) + copy / 2]
    assert moved, "no wake or sleep moved the weights over the host link: the test checks nothing"
    wrong = [
        (e, round(got, 4), round(want, 4)) for e, got, want in charges if not math.isclose(got, want, abs_tol=1e-6)
    ]
    assert not wrong, f"(effect, charged s, its terms' sum s): {wrong}"

"""Fit the cost model's efficiency factors to a real run's measured per-stage step times.

``rlharness calibrate step TIMINGS`` reads a timings file (format below), predicts each
stage of each step with the formulas of ``formulas.py`` and fits the factors each stage
depends on; ``rlharness fidelity step TIMINGS --calibration FILE`` predicts with a
calibration's factors and reports the per-stage error. The stages and what they fit:

* ``training_s`` and ``log_probs_s`` -> ``train_mfu`` (``moe_train_mfu`` for a run whose
  model has ``experts_per_token``): y = A / mfu + C, A the FLOP time (compute and pipeline
  bubble at MFU 1), C the communication (:func:`formulas.train_pass_s`); the training pass
  times the placement the simulator charges (:func:`_placement`: the colocated-training
  factor, by the run's ``colocated``), so the fitted rate is the one the derivation reads;
* ``generation_s`` -> ``hbm_efficiency`` and ``decode_flops_efficiency``: a rank serves its
  S sequences at concurrency c = min(S, KV capacity) for S·D/c decode steps of
  t(c) = a + β·c (:func:`formulas.decode_curve`), so y = X_h / hbm + X_d / flops + X_0;
  with a single configuration the two cannot be told apart and ``decode_flops_efficiency``
  keeps its default; a mixture of experts' routed experts' matmuls are in X_0 at
  ``moe_decode_flops_efficiency``'s default (measured, not fitted: ``moe.py``), as the
  simulator charges them, so a MoE run does not fit them into ``decode_flops_efficiency``;
* ``refit_s`` -> ``link_efficiency``: y = X / efficiency. Colocated (NeMo RL's refit), X is
  the gather of every tensor whole from the training layout over its groups' links
  (:func:`refit_formulas.refit_gather_s`, Megatron-Bridge's order, at efficiency 1): a run with
  nothing to gather (TP, PP and EP all 1) measures no link and is left out of the fit.
  Disaggregated, X = (W / infer_tp) / NIC share, the bytes each inference GPU receives.

Each factor is the least-squares fit of relative errors, clipped to (0, 1]. Explicit
fields of a scenario still win over a calibration (``step_calibration: FILE``).

The timings file (YAML or JSON)::

    format: rlharness-step-timings
    version: 1
    runs:
    - name: run-a
      gpu: h100_sxm                 # a GPU preset
      gpus_per_node: 8
      model: {preset: qwen2.5-7b}   # or params, layers, hidden_size, num_kv_heads, head_dim
                                    # (+ active_params, experts_per_token, bytes_per_param)
      train_gpus: 8
      infer_gpus: 8
      infer_tp: 2
      colocated: true               # training and inference share the GPUs
      train: {tp: 1, pp: 1, cp: 1, ep: 1, micro_batch: 1, global_batch: 0}
      log_prob_passes: 1            # 2 when a reference policy's log-probs are computed too
      batch: {trajectories: 512, prompt_tokens: 256, decode_tokens: 1000}   # decode: the mean
      steps:
      - {generation_s: 41.2, log_probs_s: 5.1, training_s: 20.3, refit_s: 3.2}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from harness.ordered_sum import ordered_sum
from simulators.costmodel import formulas as f
from simulators.costmodel import refit_formulas as rf
from simulators.costmodel.colocation import train_s
from simulators.costmodel.hardware import GpuSpec
from simulators.scenario.spec import CostSpec

TIMINGS_FORMAT = "rlharness-step-timings"
CALIBRATION_FORMAT = "rlharness-step-calibration"
VERSION = 1
STAGES = ("generation_s", "log_probs_s", "training_s", "refit_s")
#: the CostSpec fields a step calibration may set
FACTORS = ("train_mfu", "moe_train_mfu", "hbm_efficiency", "decode_flops_efficiency", "link_efficiency")
DEFAULTS = {
    "train_mfu": 0.35,
    "moe_train_mfu": 0.16,
    "hbm_efficiency": 0.8,
    "decode_flops_efficiency": 0.5,
    "link_efficiency": 1.0,
}


class StepTimingsError(ValueError):
    """Bad input: the message names the field (``FILE: runs[0].steps[1].training_s: ...``)."""


@dataclass(frozen=True)
class Run:
    name: str
    gpu: GpuSpec
    per_node: int
    arch: f.Arch
    train_gpus: int
    infer_gpus: int
    infer_tp: int
    colocated: bool
    layout: f.Parallel
    trajectories: int
    prompt_tokens: float
    decode_tokens: float
    steps: Tuple[Mapping[str, float], ...]
    log_prob_passes: int = 1  # 2: the policy's and a reference policy's log-probs


def efficiency(factors: Mapping[str, float]) -> f.Efficiency:
    v = {**DEFAULTS, **factors}
    return f.Efficiency(
        v["train_mfu"],
        v["decode_flops_efficiency"],
        v["hbm_efficiency"],
        10e-6,
        256,
        0.0,
        0.0,
        v["moe_train_mfu"],
        v["link_efficiency"],
        decode_step_overhead_s=CostSpec.decode_step_overhead_s,
        moe_decode_flops_efficiency=CostSpec.moe_decode_flops_efficiency,
    )  # neither fitted: each its source's figure


def links(run: Run) -> f.Links:
    g = run.gpu
    return f.Links(g.nvlink_bytes_per_s or g.pcie_bytes_per_s, g.nic_bytes_per_s, run.per_node)


def refit_link(run: Run) -> float:
    """Bytes/s a disaggregated run's weights cross (efficiency 1): they leave the training
    nodes over the NICs (a colocated run's refit is the gather, :func:`_refit_term`)."""
    return links(run).inter


# ---------------------------------------------------------------------- the stage model


def _train_terms(run: Run, e: f.Efficiency, backward: bool) -> Tuple[float, float]:
    """(A, C): seconds at MFU 1 of compute + bubble, and of communication."""
    one = replace(e, train_mfu=1.0, moe_train_mfu=1.0)
    parts = f.train_pass_s(
        run.arch,
        run.layout,
        run.trajectories,
        run.prompt_tokens + run.decode_tokens,
        run.train_gpus,
        run.gpu.bf16_flops,
        links(run),
        one,
        backward,
    )
    a = parts["compute"] + parts["pp_bubble"]
    passes = 1 if backward else run.log_prob_passes
    return passes * a, passes * (parts["total"] - a)


def _gen_terms(run: Run, e: f.Efficiency) -> Tuple[float, float, float]:
    """(X_h, X_d, X_0): generation = X_h / hbm_efficiency + X_d / decode_flops_efficiency + X_0."""
    a, g, tp = run.arch, run.gpu, run.infer_tp
    ranks = max(1, run.infer_gpus // tp)
    seqs = run.trajectories / ranks
    tokens = run.prompt_tokens + run.decode_tokens
    cap = f.kv_capacity(a, tp, float(g.hbm_bytes), 0.9, tokens, e)
    c = max(1.0, min(seqs, float(cap) if cap else 1.0))
    n_steps = seqs * run.decode_tokens / c
    ctx = run.prompt_tokens + run.decode_tokens / 2.0
    x_h = n_steps * (a.params * a.bytes_per_param + c * f.kv_bytes_per_token(a) * ctx) / (tp * g.hbm_bytes_per_s)
    routed = f.routed_active_params(a)  # at moe_decode_flops_efficiency, not fitted (the module doc)
    x_d = n_steps * c * 2.0 * (a.active_params - routed) / (tp * g.bf16_flops)
    x_0 = n_steps * (e.decode_step_overhead_s + c * 2.0 * routed / (tp * g.bf16_flops * e.moe_decode_flops_efficiency))
    if tp > 1:
        link = links(run).for_group(tp, e)
        x_0 += n_steps * (
            f.decode_allreduce_latency_s(a, tp, links(run).gpus_per_node, e)
            + c * 4.0 * a.layers * a.hidden_size * a.bytes_per_param * (tp - 1) / tp / link
        )
    return x_h, x_d, x_0


def _refit_term(run: Run) -> float:
    """Seconds of the refit's link time at ``link_efficiency`` 1 (see the module doc)."""
    if run.colocated:
        one = efficiency({"link_efficiency": 1.0})
        return rf.refit_gather_s(run.arch, run.layout, run.train_gpus, links(run), one)["total"]
    return run.arch.params * run.arch.bytes_per_param / run.infer_tp / refit_link(run)


def _placement(run: Run, backward: bool) -> float:
    """What the simulator multiplies a pass at the fitted rate by for where ``run`` trains
    (:func:`colocation.train_s`: a dense rate is colocated training's, a MoE rate dedicated
    training's), so that a factor fitted here is the one the scenario's derivation reads."""
    return train_s(1.0, not run.colocated, run.arch.moe) if backward else 1.0


def predict(run: Run, factors: Mapping[str, float]) -> Dict[str, float]:
    """Each stage's predicted seconds for one step of ``run``."""
    e = efficiency(factors)
    mfu = e.mfu(run.arch)
    out = {}
    for stage, backward in (("training_s", True), ("log_probs_s", False)):
        a, c = _train_terms(run, e, backward)
        out[stage] = (a / mfu + c) * _placement(run, backward)
    x_h, x_d, x_0 = _gen_terms(run, e)
    out["generation_s"] = x_h / e.hbm_efficiency + x_d / e.decode_flops_efficiency + x_0
    out["refit_s"] = _refit_term(run) / e.link_efficiency
    return out


# ---------------------------------------------------------------------- the fit


def _clip(inverse: float) -> Optional[float]:
    """A factor from its fitted inverse, in (0, 1]; None if the fit is not positive."""
    if not math.isfinite(inverse) or inverse <= 0:
        return None
    return min(1.0, 1.0 / inverse)


def _fit_inverse(rows: Sequence[Tuple[float, float, float]]) -> Optional[float]:
    """u minimizing sum(((x·u + c − y)/y)^2) over rows (x, c, y)."""
    num = ordered_sum(x * (y - c) / (y * y) for x, c, y in rows)
    den = ordered_sum(x * x / (y * y) for x, c, y in rows)
    return num / den if den > 0 else None


def fit(runs: Sequence[Run]) -> Dict[str, float]:
    """The factors the measured stages determine (a factor no stage measures is left out)."""
    out: Dict[str, float] = {}
    refit_rows = [
        (_refit_term(r), 0.0, s["refit_s"]) for r in runs for s in r.steps if "refit_s" in s and _refit_term(r) > 0
    ]  # nothing gathered: no link measured
    if refit_rows:
        v = _clip(_fit_inverse(refit_rows) or -1)
        if v is not None:
            out["link_efficiency"] = v
    e = efficiency(out)
    for key, moe in (("train_mfu", False), ("moe_train_mfu", True)):
        rows = []
        for r in runs:
            if r.arch.moe != moe:
                continue
            for stage, backward in (("training_s", True), ("log_probs_s", False)):
                a, c = _train_terms(r, e, backward)
                m = _placement(r, backward)
                rows += [(a * m, c * m, s[stage]) for s in r.steps if stage in s]
        v = _clip(_fit_inverse(rows) or -1) if rows else None
        if v is not None:
            out[key] = v
    gen = [(_gen_terms(r, e), s["generation_s"]) for r in runs for s in r.steps if "generation_s" in s]
    if gen:
        out.update(_fit_generation(gen))
    return out


def _fit_generation(rows: Sequence[Tuple[Tuple[float, float, float], float]]) -> Dict[str, float]:
    """Two-factor least squares in (1/hbm, 1/flops); one factor when the rows cannot separate them."""
    shm = shd = sdd = bh = bd = 0.0
    for (xh, xd, x0), y in rows:
        w = 1.0 / (y * y)
        shm += xh * xh * w
        shd += xh * xd * w
        sdd += xd * xd * w
        bh += xh * (y - x0) * w
        bd += xd * (y - x0) * w
    det = shm * sdd - shd * shd
    if det > 1e-9 * shm * sdd:
        hbm, flops = _clip((bh * sdd - bd * shd) / det), _clip((shm * bd - shd * bh) / det)
        if hbm is not None and flops is not None:
            return {"hbm_efficiency": hbm, "decode_flops_efficiency": flops}
    fixed = 1.0 / DEFAULTS["decode_flops_efficiency"]
    u = _fit_inverse([(xh, x0 + xd * fixed, y) for (xh, xd, x0), y in rows])
    hbm = _clip(u if u is not None else -1)
    return {"hbm_efficiency": hbm} if hbm is not None else {}


def errors(runs: Sequence[Run], factors: Mapping[str, float]) -> List[Tuple[str, str, float, float]]:
    """(run, stage, measured mean s, predicted s) for every stage a run measures."""
    out = []
    for r in runs:
        pred = predict(r, factors)
        for stage in STAGES:
            vals = [s[stage] for s in r.steps if stage in s]
            if vals:
                out.append((r.name, stage, ordered_sum(vals) / len(vals), pred[stage]))
    return out


# ---------------------------------------------------------------------- parsing


def parse_timings(data: Any, where: str) -> List[Run]:
    """The runs of a parsed timings file; StepTimingsError names the first bad field."""
    from simulators.costmodel.stepfit_parse import parse  # the field-by-field checks

    return parse(data, where)

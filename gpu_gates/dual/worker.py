"""Gate 4 workers: a real process per trainer and per inference DP rank.

Each worker executes commands the driver (rank 0's driver thread) posts through the TCP
store, one at a time, in order: ``dual/cmd/<rank>/<i>`` → ``dual/res/<rank>/<i>``. The
commands are what the harness control logic's effects become on real hardware: a real
training step on a small mixed-dtype model, a real CPU bucket cache, the selective sync
in the harness's order (``harness.control.selective_sync`` through
``gpu_gates/sync/runtime.py``: a dynamic process group of owner + broadcast targets made
by its members only, the refit stream for targets declared on the owner's device), and
SHA-256 digests compared bit for bit on the receivers.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, List, Optional, Set

import torch

from gpu_gates.runtime.gate import GateContext
from gpu_gates.sync.runtime import OwnerSync, SyncGroup, SyncLink, run_owner, serve_receiver
from gpu_gates.sync.tiny_model import TinyModel
from harness.control.selective_sync import plan_sync
from gpu_gates.sync.bucket_cache import VersionedBucketCache, build_buckets, state_digests

# rank -> (pipeline, role, dp rank or None, logical GPU)
ROLES = {
    0: ("ppl1", "trainer", None, 0),
    1: ("ppl1", "infer", 0, 0),
    2: ("ppl1", "infer", 1, 1),
    3: ("ppl2", "trainer", None, 1),
    4: ("ppl2", "infer", 0, 0),
    5: ("ppl2", "infer", 1, 1),
}
TRAIN_SEEDS = {"ppl1": 11, "ppl2": 22}  # different weights: a cross-pipeline mix-up cannot pass
WORLD = len(ROLES)


def rank_of(pipeline: str, role: str, dp: Optional[int] = None) -> int:
    for r, (p, ro, d, _) in ROLES.items():
        if p == pipeline and ro == role and d == dp:
            return r
    raise KeyError((pipeline, role, dp))


class Worker:
    def __init__(self, ctx: GateContext) -> None:
        self.ctx = ctx
        self.pipeline, self.role, self.dp, self.gpu = ROLES[ctx.rank]
        self.model: Optional[TinyModel] = None
        self.cache: Optional[VersionedBucketCache] = None
        self.train_group: Any = None
        self.held_version: Optional[int] = None
        self.run_failed = False  # the driver's stop said the run had already failed
        self.requests = Requests(ctx.hooks.get("abort_never_wakes") is not None) if self.role == "infer" else None
        if self.role == "trainer":
            self.model = TinyModel(TRAIN_SEEDS[self.pipeline]).to(ctx.device)
            self.cache = VersionedBucketCache()

    # ------------------------------------------------------------------ command loop
    def serve(self) -> None:
        ctx, i = self.ctx, 0
        while True:
            ctx.set_phase(
                f"{self.pipeline} {self.role}{'' if self.dp is None else f' dp{self.dp}'}: waiting for command {i}"
            )
            msg = json.loads(ctx.wait_get(f"dual/cmd/{ctx.rank}/{i}", f"command {i} from the driver"))
            if msg["op"] == "stop":
                self.run_failed = bool(msg.get("failed"))
                return
            ctx.set_phase(f"{self.pipeline} rank {ctx.rank}: {msg['op']}")
            ctx.hook(msg["op"])
            try:
                result = getattr(self, "op_" + msg["op"])(**msg.get("args", {}))
                reply = {"ok": True, "result": result}
            except Exception as exc:  # reported to the driver, which fails the gate with it
                reply = {"ok": False, "error": f"rank {ctx.rank} {msg['op']}: {type(exc).__name__}: {exc}"}
                ctx.fail(reply["error"])
            ctx.put(f"dual/res/{ctx.rank}/{i}", json.dumps(reply).encode())
            i += 1

    # ------------------------------------------------------------------ trainer side
    def op_reload_comm(self, step: int) -> str:
        """Re-create the trainer's (here single-member) training group for this step; a
        group still alive (NeMo keeps it across init, docs/residency.md) is reused, as
        ROLL's ``reload_process_groups`` and NeMo's snapshot reload do."""
        if self.train_group is None:
            self.train_group = SyncGroup(
                self.ctx, f"{self.pipeline}_megatron_s{step}", [self.ctx.rank], purpose="training", emit=True
            )
        return self.train_group.name

    def drop_training_group(self) -> None:
        """A run that ends abnormally (timeout, failed peer) interrupts a trainer whose
        training group is legitimately alive (NeMo keeps it across steps, docs/residency.md);
        its process would tear it down on exit. Only the failure paths call this, so a group
        still alive after a run that completed is still reported by ``no_group_survives``."""
        self.op_destroy_comm()

    def op_destroy_comm(self) -> Optional[str]:
        if self.train_group is None:
            return None
        name = self.train_group.name
        self.train_group.close()
        self.train_group = None
        return name

    def op_train(self, step: int) -> str:
        self.model.train_step(step, TRAIN_SEEDS[self.pipeline])
        return f"step {step}"

    def op_build_cache(self, version: int, bucket_size: int) -> Dict[str, Any]:
        named = [(n, t.detach().cpu()) for n, t in self.model.named_state()]
        buckets = build_buckets(named, bucket_size)
        self.cache.build_latest(version, buckets)
        digests = state_digests(named)
        manifest = {"version": version, "buckets": [b.metadata() for b in buckets], "digests": digests}
        self.ctx.put(f"dual/{self.pipeline}/manifest/{version}", json.dumps(manifest).encode())
        self.ctx.emit("cache_build", version=version, buckets=len(buckets), bytes=sum(b.used_bytes for b in buckets))
        return {"buckets": len(buckets)}

    def op_promote(self, version: int) -> int:
        self.cache.promote(version)
        self.ctx.emit("cache_promote", version=version)
        return version

    def op_offload(self) -> int:
        if self.ctx.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()
            self.model.to(self.ctx.device)  # the next step onloads again; the sample shows the release
        return self.cache.latest_version if self.cache.latest_version is not None else -1

    def _link(self, sync_id: str, rank_of: Dict[str, int], owner: int) -> SyncLink:
        manifest = self._manifest_of(sync_id)
        return SyncLink(
            sync_id,
            f"dual/{sync_id}",
            owner,
            {int(d): r for d, r in rank_of.items()},
            max(b["used_bytes"] for b in manifest["buckets"]),
        )

    def _manifest_of(self, sync_id: str) -> Dict[str, Any]:
        version = int(sync_id.rsplit("_v", 1)[1])
        return json.loads(
            self.ctx.wait_get(f"dual/{self.pipeline}/manifest/{version}", f"manifest of version {version}")
        )

    def op_sync_send(
        self, sync_id: str, version: int, rank_of: Dict[str, int], ipc_dp: List[int], bcast_dp: List[int]
    ) -> Dict[str, Any]:
        """The owner's side: ``harness.control.selective_sync`` with the gates' handlers."""
        link = self._link(sync_id, rank_of, self.ctx.rank)
        manifest = self._manifest_of(sync_id)
        plan = plan_sync(
            version,
            [b["used_bytes"] for b in manifest["buckets"]],
            ipc_dp,
            bcast_dp,
            sync_id,
            [self.ctx.rank] + link.ranks(bcast_dp),
        )
        sent = run_owner(self.ctx, OwnerSync(self.ctx, self.cache, link), plan)
        return {"bytes": sum(sent.values()), "buckets": len(plan.bucket_bytes)}

    # ------------------------------------------------------------------ inference side
    def op_wake(self, level: int) -> Optional[int]:
        # level 2 dropped the weights: the woken rank holds garbage until a sync
        self.model = TinyModel(1000 + self.ctx.rank).to(self.ctx.device)
        self.held_version = None
        return self.held_version

    def op_sync_recv(self, sync_id: str, version: int, owner: int, rank_of: Dict[str, int]) -> int:
        """A receiver's side: the owner's orders (``gpu_gates/sync/runtime.serve_receiver``)."""
        link = self._link(sync_id, rank_of, owner)
        serve_receiver(self.ctx, link, self._manifest_of(sync_id)["buckets"], self.model, version)
        self.held_version = version
        return version

    def op_finalize(self, version: int) -> Dict[str, Any]:
        manifest = json.loads(
            self.ctx.wait_get(f"dual/{self.pipeline}/manifest/{version}", f"manifest of version {version}")
        )
        mine = state_digests((n, t.detach().cpu()) for n, t in self.model.named_state())
        bad = sorted(n for n, d in manifest["digests"].items() if mine.get(n) != d)
        self.ctx.emit("digest_check", version=version, ok=not bad, mismatches=len(bad), target=True)
        return {"ok": not bad, "mismatched": bad, "held": self.held_version}

    def op_submit(self, request_id: int, tokens: int) -> None:
        """Start one generation request; it decodes in the background (see :class:`Requests`)."""
        if self.model is None:
            raise RuntimeError("request submitted to a sleeping rank")
        self.requests.submit(request_id, tokens, self.model)

    def op_collect(self) -> List[List[Any]]:
        """The requests that ended since the last collect: ``[request id, "done" | "aborted"]``."""
        return self.requests.collect()

    def op_in_flight(self) -> int:
        return self.requests.in_flight()

    def op_abort(self) -> int:
        """Abort every request in flight (each ends at its next token); returns how many."""
        return self.requests.abort()

    def op_sleep(self, level: int) -> None:
        left = self.requests.in_flight()
        if left:  # the drain exists so that this never happens
            raise RuntimeError(f"sleep with {left} request(s) still in flight")
        self.model = None
        self.held_version = None
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        return None


class Requests:
    """An inference rank's generation requests, decoding in background threads.

    A request decodes ``tokens`` steps of a stand-in decode loop (real compute on the served
    weights, ``TOKEN_S`` per token), so requests are in flight while the driver goes on: an
    abort marks them and each ends at its next token boundary, reported as ``aborted`` for
    the rollout to re-dispatch, as vLLM's abort does. With ``never_wakes`` (test hook
    ``abort_never_wakes``, RLix's Bug 7: the abort never wakes the generating caller) an
    aborted request stays in flight for good, and only the drain's deadline ends the run.
    """

    TOKEN_S = 0.01

    def __init__(self, never_wakes: bool = False) -> None:
        self.lock = threading.Lock()
        self.running: Set[int] = set()
        self.aborting: Set[int] = set()
        self.ended: List[List[Any]] = []
        self.never_wakes = never_wakes
        self.stuck = threading.Event()  # never set: what a never-woken request waits on

    def submit(self, request_id: int, tokens: int, model: TinyModel) -> None:
        with self.lock:
            if request_id in self.running:
                raise RuntimeError(f"request {request_id} is already in flight")
            self.running.add(request_id)
        threading.Thread(
            target=self._decode, args=(request_id, tokens, model), name=f"request {request_id}", daemon=True
        ).start()

    def _decode(self, request_id: int, tokens: int, model: TinyModel) -> None:
        status = "done"
        x = model.norm.detach()
        for _ in range(tokens):
            with self.lock:
                aborted = request_id in self.aborting
            if aborted:
                status = "aborted"
                break
            x = torch.tanh(model.head.float() @ x[: model.head.shape[1]].float()).repeat(2)[: x.numel()]
            time.sleep(self.TOKEN_S)
        with self.lock:
            # an abort that landed during the last token, before the request reported its
            # end, still ends it as aborted: so every request an abort counted in flight is
            # one that ends aborted (or, with never_wakes, stays in flight)
            if request_id in self.aborting:
                status = "aborted"
        if status == "aborted" and self.never_wakes:
            self.stuck.wait()  # forever: the process exits around this daemon thread
        with self.lock:
            self.running.discard(request_id)
            self.aborting.discard(request_id)
            self.ended.append([request_id, status])

    def abort(self) -> int:
        with self.lock:
            self.aborting |= self.running
            return len(self.running)

    def in_flight(self) -> int:
        with self.lock:
            return len(self.running)

    def collect(self) -> List[List[Any]]:
        with self.lock:
            out, self.ended = self.ended, []
        return out

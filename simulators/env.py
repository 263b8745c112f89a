"""The simpy environment with an explicit order for events at the same simulated time.

simpy orders events by (time, priority, insertion counter); two processes waking at the
same instant therefore run in whatever order their events happened to be created. That
is deterministic for one program, but fragile: an unrelated change in creation order
silently reorders a log. Here every process carries an ``order_key`` (a tuple of ints)
and an event is keyed by the process that scheduled it:

    (time, (simpy priority, order_key of the scheduling process), insertion counter)

Keys, smallest first (see ``ORDER``): the scheduler loop, then pipelines by their index
in the scenario, then coordinator resize calls, then inference ranks, then request
completions. Within one process, program order decides (the insertion counter).

Because the log depends on every event's key, the two lean stand-ins here
(:class:`FirstOf` for ``any_of``, :class:`Link` for ``simpy.Resource``) schedule exactly
the events simpy's would, from the same process, in the same order: same keys, same log.
They exist for speed (about 8 % of a 64-GPU run, measured) and lean on simpy 4's event
internals (``_ok``, ``_value``, ``PENDING``), hence the ``simpy<5`` pin; the byte-identical
log tests would catch a simpy change that broke them.
"""

from __future__ import annotations

from heapq import heappush
from typing import Any, Dict, Generator, List, Tuple

import simpy
from simpy.core import NORMAL, URGENT
from simpy.events import PENDING, Event, Process

ORDER = {
    "scheduler": 0,
    "pipeline": 1,
    "resize": 2,
    "watchdog": 3,
    "collector": 4,
    "rank": 5,
}
ROOT_KEY: Tuple[int, ...] = (-1,)


def _keyed_prios(key: Tuple[int, ...]) -> Dict[int, Tuple[int, Tuple[int, ...]]]:
    """The heap priorities (simpy priority, order key) of one process, built once."""
    return {URGENT: (URGENT, key), NORMAL: (NORMAL, key)}


_ROOT_PRIOS = _keyed_prios(ROOT_KEY)


class SimEnv(simpy.Environment):
    """simpy.Environment whose same-time tie-break is the scheduling process's key."""

    def schedule(self, event: Any, priority: Any = NORMAL, delay: float = 0) -> None:
        # Hot path (every simpy event): a keyed process (or none) and URGENT/NORMAL. A
        # tuple priority is not a key of the prios dicts, so it takes the slow path too.
        proc = self._active_proc
        try:
            prio = (_ROOT_PRIOS if proc is None else proc.order_prios)[priority]
        except (AttributeError, KeyError, TypeError):
            prio = _slow_prio(proc, priority)
        heappush(self._queue, (self._now + delay, prio, next(self._eid), event))

    def spawn(self, generator: Generator, kind: str, *ids: int) -> Process:
        """Start a process with the order key (ORDER[kind], *ids)."""
        proc = _KeyedProcess(self, generator, (ORDER[kind], *ids))
        return proc

    def scheduled_events(self) -> int:
        """How many events have been scheduled so far (consumes one counter value)."""
        return next(self._eid)


def _slow_prio(proc: Any, priority: Any) -> Tuple[int, Tuple[int, ...]]:
    if isinstance(priority, tuple):  # already keyed (re-schedule)
        return priority
    prios = getattr(proc, "order_prios", _ROOT_PRIOS) if proc is not None else _ROOT_PRIOS
    prio = prios.get(priority)
    if prio is None:
        prio = (int(priority), getattr(proc, "order_key", ROOT_KEY) if proc is not None else ROOT_KEY)
    return prio


class FirstOf(Event):
    """``env.any_of([a, b])`` for two events whose value nobody reads, minus the
    ConditionValue bookkeeping. It is triggered (so scheduled: one event, with the same
    priority and counter position) exactly when simpy's AnyOf would be — by the first of
    ``a``/``b`` to be processed, or at once if one already was — and, when processed,
    detaches its check from the other event, as Condition._build_value does."""

    def __init__(self, env: SimEnv, a: Event, b: Event) -> None:
        self.env = env
        self.callbacks = [self._detach]
        self._value = PENDING
        self._events = (a, b)
        check = self._check
        for ev in (a, b):
            if ev.callbacks is None:
                check(ev)
            else:
                ev.callbacks.append(check)

    def _check(self, event: Event) -> None:
        if self._value is not PENDING:
            return
        if not event._ok:
            event._defused = True
            self.fail(event._value)
        else:
            self._ok = True
            self._value = None
            self.env.schedule(self)

    def _detach(self, _event: Event) -> None:
        check = self._check
        for ev in self._events:
            cbs = ev.callbacks
            if cbs and check in cbs:
                cbs.remove(check)


class Link:
    """``simpy.Resource(env, capacity)`` trimmed to what the simulator uses — request,
    release, the ``with`` form — with the very same events (so the same log): a request
    is triggered at once if a slot is free *and* it heads the queue, a release is one
    event that frees the slot immediately, and the next queued request is granted when
    that release event is processed (simpy's ``_trigger_put``, head of the queue only).
    What it drops is simpy's generic put/get machinery (a no-op ``_trigger_get``
    callback per request, queue scans, ``usage_since``)."""

    __slots__ = ("_env", "capacity", "users", "queue")

    def __init__(self, env: SimEnv, capacity: int = 1) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        self._env = env
        self.capacity = capacity
        self.users: List[LinkRequest] = []
        self.queue: List[LinkRequest] = []  # pending requests, FIFO

    def request(self) -> "LinkRequest":
        return LinkRequest(self)

    def release(self, request: "LinkRequest") -> "LinkRelease":
        return LinkRelease(self, request)

    def _grant_head(self, _event: Any = None) -> None:
        queue = self.queue
        if queue and len(self.users) < self.capacity:
            req = queue.pop(0)
            self.users.append(req)
            req.succeed()


class LinkRequest(Event):
    """A usage request (simpy's ``Request``); ``with link.request() as req`` releases it."""

    def __init__(self, link: Link) -> None:
        self.env = link._env
        self.callbacks = []
        self._value = PENDING
        self.resource = link
        link.queue.append(self)
        link._grant_head()

    def __enter__(self) -> "LinkRequest":
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if self._value is PENDING:  # never granted: leave the queue (simpy's cancel)
            self.resource.queue.remove(self)
        if exc_type is not GeneratorExit:  # as simpy: no release on generator cleanup
            self.resource.release(self)


class LinkRelease(Event):
    """A release (simpy's ``Release``): frees the slot now, grants the queue head when processed."""

    def __init__(self, link: Link, request: LinkRequest) -> None:
        self.env = link._env
        self.callbacks = [link._grant_head]
        self._value = PENDING
        self.request = request
        try:
            link.users.remove(request)
        except ValueError:
            pass
        self.succeed()


class _KeyedProcess(Process):
    def __init__(self, env: SimEnv, generator: Generator, key: Tuple[int, ...]) -> None:
        self.order_key = key  # set before Process.__init__ schedules the Initialize event
        self.order_prios = _keyed_prios(key)
        super().__init__(env, generator)


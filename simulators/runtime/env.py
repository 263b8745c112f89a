"""The simpy environment with an explicit order for events at the same simulated time.

simpy orders events by (time, priority, insertion counter); two processes waking at the
same instant therefore run in whatever order their events happened to be created. That
is deterministic for one program, but fragile: an unrelated change in creation order
silently reorders a log. Here every process carries an ``order_key`` (a tuple of ints)
and an event is keyed by the process that scheduled it:

    (time, (simpy priority, order_key of the scheduling process), insertion counter)

Keys, smallest first (see ``ORDER``): the scheduler loop, then pipelines by their index
in the scenario, then coordinator resize calls, then the GENERATION watchdogs, then
generate callers polling for an active rank, and last the inference ranks (their request
completions). Within one process,
program order decides (the insertion counter).

Not everything keyed is a process: an :class:`Actor` is a key without a generator, and a
:class:`Timer` runs one callback on an actor's behalf after a delay — events it schedules
carry the actor's key, as if a process with that key had run the same code. Request
completions are timers (one event each) rather than a serving process per rank, which
would spend three or four events per completion waking up and re-arming.

Because the log depends on every event's key, the lean stand-in :class:`Link` (for
``simpy.Resource``) schedules exactly the events simpy's would, from the same process, in
the same order: same keys, same log. It and :class:`Timer` exist for speed and lean on
simpy 4's event internals (``_ok``, ``_value``, ``PENDING``, ``_queue``, ``_eid``,
``_active_proc``), hence the ``simpy<5`` pin; ``tests/sim/test_env.py`` pins what they
must do. The hottest record builders read ``env._now`` (the field behind the ``now``
property, without the property call) for the same reason.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Dict, Generator, List, Tuple

import simpy
from simpy.core import NORMAL, URGENT, BoundClass, EmptySchedule, StopSimulation
from simpy.events import PENDING, Event, EventPriority, Process

ORDER = {
    "scheduler": 0,
    "pipeline": 1,
    "resize": 2,
    "watchdog": 3,
    "caller": 4,  # generate callers polling for an active rank (simulators/pipelines/inference.py)
    "rank": 5,
    "timeout": 6,  # RLix's timeouts (simulators/runtime/timeouts.py): a wait ending at its limit is in time
    "sync_member": 7,  # weight-sync group members and their join RPCs (simulators/refit/groups.py)
}
ROOT_KEY: Tuple[int, ...] = (-1,)


def _keyed_prios(key: Tuple[int, ...]) -> Dict[int, Tuple[int, Tuple[int, ...]]]:
    """The heap priorities (simpy priority, order key) of one process, built once."""
    return {URGENT: (URGENT, key), NORMAL: (NORMAL, key)}


_ROOT_PRIOS = _keyed_prios(ROOT_KEY)


class Actor:
    """An order key without a process: what a :class:`Timer` runs on behalf of."""

    __slots__ = ("order_key", "order_prios")

    def __init__(self, kind: str, *ids: int) -> None:
        self.order_key = (ORDER[kind], *ids)
        self.order_prios = _keyed_prios(self.order_key)


class SimEnv(simpy.Environment):
    """simpy.Environment whose same-time tie-break is the scheduling process's key.

    With an ``explorer`` (``simulators/runtime/explore.py``) the tie-break between processes is the
    explorer's rank of (process, instant) instead, the key only breaking rank ties; the
    unexplored path is untouched (no check on it: :meth:`schedule` is swapped for the run).
    """

    def __init__(self, initial_time: float = 0, explorer: Any = None) -> None:
        super().__init__(initial_time)
        self.explorer = explorer
        if explorer is not None:
            self.schedule = self._schedule_explored  # type: ignore[method-assign]
        # simpy binds its event factories (timeout, event, all_of, ...) to the instance
        # once, but only those in the instance's own class dict: a subclass like this one
        # would build a bound method on every env.timeout(...) call. Bind them here.
        for name, attr in vars(simpy.Environment).items():
            if type(attr) is BoundClass:
                setattr(self, name, getattr(self, name))

    def schedule(self, event: Any, priority: Any = NORMAL, delay: float = 0) -> None:
        # Hot path (every simpy event): a keyed process (or none) and URGENT/NORMAL. A
        # tuple priority is not a key of the prios dicts, so it takes the slow path too.
        proc = self._active_proc
        try:
            prio = (_ROOT_PRIOS if proc is None else proc.order_prios)[priority]
        except (AttributeError, KeyError, TypeError):
            prio = _slow_prio(proc, priority)
        heappush(self._queue, (self._now + delay, prio, next(self._eid), event))

    def _schedule_explored(self, event: Any, priority: Any = NORMAL, delay: float = 0) -> None:
        heappush(
            self._queue,
            (self._now + delay, self.explored_prio(self._active_proc, priority, delay), next(self._eid), event),
        )

    def explored_prio(self, proc: Any, priority: Any, delay: float) -> Tuple[int, float, Tuple[int, ...]]:
        """(simpy priority, the explorer's rank, key): simpy's URGENT/NORMAL still first."""
        if isinstance(priority, tuple):  # already ranked (re-schedule)
            return priority
        key = getattr(proc, "order_key", ROOT_KEY) if proc is not None else ROOT_KEY
        at = self._now + delay
        return (int(priority), self.explorer.rank(key, at, self._now), key)

    def run(self, until: Any = None) -> Any:
        """simpy's ``run(until=event)`` with :meth:`step` inlined: the same events in the
        same order with the same outcomes (a failed event nobody defused crashes the run; a
        StopSimulation puts the rest of the event's callbacks back), one method call less
        per event. Any other ``until`` (a time, None) goes to simpy's own loop."""
        if not isinstance(until, Event) or until.callbacks is None:
            return super().run(until)
        until.callbacks.append(StopSimulation.callback)
        queue = self._queue
        try:
            while True:
                if not queue:
                    raise EmptySchedule
                self._now, _, _, event = heappop(queue)
                callbacks, event.callbacks = event.callbacks, None
                try:
                    for callback in callbacks:
                        callback(event)
                except StopSimulation:
                    event.callbacks = callbacks[callbacks.index(callback) + 1 :]
                    self.schedule(event, EventPriority(-1))
                    raise
                if not event._ok and not hasattr(event, "_defused"):
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    raise exc
        except StopSimulation as stop:
            return stop.args[0]  # == until.value
        except EmptySchedule:
            assert not until.triggered
            raise RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}') from None

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


class Link:
    """``simpy.Resource(env, capacity)`` trimmed to what the simulator uses — request,
    release, the ``with`` form — with the very same events (so the same log): a request
    is triggered at once if a slot is free *and* it heads the queue, a release is one
    event that frees the slot immediately, and the next queued request is granted when
    that release event is processed (simpy's ``_trigger_put``, head of the queue only).
    What it drops is simpy's generic put/get machinery (a no-op ``_trigger_get``
    callback per request, queue scans, ``usage_since``)."""

    __slots__ = ("_env", "capacity", "users", "queue", "unordered")

    def __init__(self, env: SimEnv, capacity: int = 1, unordered: bool = False) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        self._env = env
        self.capacity = capacity
        self.users: List[LinkRequest] = []
        self.queue: List[LinkRequest] = []  # pending requests, FIFO
        # a lock that promises no order among its waiters (a threading.Lock): under
        # exploration the explorer picks who gets it next; otherwise FIFO, as simpy's
        self.unordered = unordered and env.explorer is not None

    def request(self) -> "LinkRequest":
        return LinkRequest(self)

    def release(self, request: "LinkRequest") -> "LinkRelease":
        return LinkRelease(self, request)

    def _grant_head(self, _event: Any = None) -> None:
        queue = self.queue
        if queue and len(self.users) < self.capacity:
            req = queue.pop(
                self._env.explorer.pick([r.key for r in queue], self._env._now)
                if self.unordered and len(queue) > 1
                else 0
            )
            self.users.append(req)
            req._ok = True  # req.succeed(), inlined: a queued request is pending by construction
            req._value = None
            self._env.schedule(req)


class LinkRequest(Event):
    """A usage request (simpy's ``Request``); ``with link.request() as req`` releases it."""

    def __init__(self, link: Link) -> None:
        self.env = link._env
        self.callbacks = []
        self._value = PENDING
        self.resource = link
        if link.unordered:  # the waiter's process key: what the explorer ranks at a hand-off
            proc = link._env._active_proc
            self.key = getattr(proc, "order_key", ROOT_KEY) if proc is not None else ROOT_KEY
        if not link.queue and len(link.users) < link.capacity:
            # it would head the queue and a slot is free: granted now (what _grant_head
            # would do after queueing it, without the queue round trip)
            link.users.append(self)
            self._ok = True
            self._value = None
            link._env.schedule(self)
        else:
            link.queue.append(self)
            link._grant_head()  # a slot freed by a release not yet processed goes to the head

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
        self._ok = True  # self.succeed(), inlined: a new event is pending
        self._value = None
        link._env.schedule(self)


class Timer(Event):
    """``fn(arg)`` after ``delay``, run for ``actor``: one event, keyed like a timeout the
    actor's process would have scheduled. While ``fn`` runs the actor stands in as the
    active process, so what ``fn`` schedules is keyed by the actor too (simpy itself only
    reads ``_active_proc`` to interrupt and to resume processes, which ``fn`` does not)."""

    __slots__ = ("actor", "fn", "arg")

    def __init__(self, env: SimEnv, delay: float, actor: Actor, fn: Any, arg: Any) -> None:
        self.env = env
        self.callbacks = [_fire_timer]  # a plain function: no bound method built per timer
        self._ok = True
        self._value = None
        self.actor, self.fn, self.arg = actor, fn, arg
        prio = actor.order_prios[NORMAL] if env.explorer is None else env.explored_prio(actor, NORMAL, delay)
        heappush(env._queue, (env._now + delay, prio, next(env._eid), self))


def _fire_timer(timer: Timer) -> None:
    """A :class:`Timer`'s one callback (simpy calls it with the processed event itself)."""
    env = timer.env
    env._active_proc = timer.actor
    try:
        timer.fn(timer.arg)
    finally:
        env._active_proc = None


class _KeyedProcess(Process):
    def __init__(self, env: SimEnv, generator: Generator, key: Tuple[int, ...]) -> None:
        self.order_key = key  # set before Process.__init__ schedules the Initialize event
        self.order_prios = _keyed_prios(key)
        super().__init__(env, generator)

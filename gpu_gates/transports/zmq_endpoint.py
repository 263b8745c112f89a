"""The socket end both sides of the refit stream share (:mod:`gpu_gates.transports.zmq_stream`).

One pyzmq socket on an ``ipc://`` endpoint with ``LINGER`` 0 and a timeout on every send
and receive. A timeout becomes a :class:`StreamTimeout` that names the peer and what was
being done, any other socket failure a :class:`StreamError`; either way the socket is
closed, because a REQ that missed its reply cannot be reused.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import zmq

Emit = Callable[..., None]


class StreamTimeout(TimeoutError):
    """A send or receive of the refit stream ran past its timeout."""


class StreamError(RuntimeError):
    """The socket failed (not a timeout), or the peer broke the protocol."""


def _socket(ctx: zmq.Context, kind: int, timeout_s: float) -> zmq.Socket:
    sock = ctx.socket(kind)
    ms = max(1, int(timeout_s * 1000))
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, ms)
    sock.setsockopt(zmq.RCVTIMEO, ms)
    return sock


class Endpoint:
    def __init__(self, endpoint: str, peer: str, timeout_s: float, kind: int, bind: bool) -> None:
        if not endpoint.startswith("ipc://"):
            raise ValueError(f"refit endpoint must be ipc://, got {endpoint!r}")
        self.endpoint, self.peer, self.timeout_s = endpoint, peer, float(timeout_s)
        self._ctx = zmq.Context()
        self.sock: Optional[zmq.Socket] = _socket(self._ctx, kind, timeout_s)
        (self.sock.bind if bind else self.sock.connect)(endpoint)

    def _io(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.sock is None:
            raise StreamError(f"refit stream to {self.peer}: socket already closed after an earlier failure ({what})")
        try:
            return fn()
        except zmq.Again:
            self.close()
            raise StreamTimeout(
                f"refit stream with {self.peer} ({self.endpoint}): {what}: nothing within "
                f"{self.timeout_s:g} s (the peer may be dead)"
            ) from None
        except zmq.ZMQError as exc:
            self.close()
            raise StreamError(
                f"refit stream with {self.peer} ({self.endpoint}): {what}: ZMQ error errno {exc.errno}: {exc}"
            ) from None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def describe(exc: BaseException) -> str:
    """One line for a ``refit_stream_abort`` record: the exception's type and first line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

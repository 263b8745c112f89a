"""torchrun for the test suite, its ranks forked from one process that imported torch once.

    python tests/gates/launch_forked.py [--preload MODULE]... [TORCHRUN FLAGS] gpu_gates/GATE.py [GATE FLAGS]

is torch's own ``torchrun --run-path --start-method fork [TORCHRUN FLAGS] GATE.py [GATE FLAGS]``
(``torch.distributed.run``: its flags, its ``LaunchConfig``, its ``LocalElasticAgent``)
after the launching process has imported the gate's module and each ``--preload`` module.

Why: on a 2-core CI machine a gate launch's CPU is mostly interpreter and ``import torch``
start-up (about 1.2 CPU s per process), paid by torchrun's agent and again by every rank:
a 6-rank launch is 7 torch imports. Forked from the agent, the ranks start with torch,
the gate and the preloaded modules already in memory: one import per launch.

What is the same as ``torchrun gpu_gates/GATE.py``: everything but how a rank process
starts. The agent, the static rendezvous on ``--master-port``, the environment of each
rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_*``), its monitoring, the teardown of the other ranks when one exits
non-zero (SIGTERM, then SIGKILL), ``--log-dir`` and the launcher's exit code (0 when every
rank ended 0, else 1 with torch's failure summary). The ranks are separate processes in
a real process group, and the gate file runs as ``__main__`` as it does under torchrun.

What differs, and only there: a rank is a fork of the agent (``multiprocessing``'s fork
start method) running the gate file through ``runpy`` (torch's ``--run-path``), not a new
``python -u GATE.py``. So a passing rank returns 0 to the agent rather than ending with
``os._exit(0)`` (``gpu_gates/runtime/gate.py: _ends_by_returning``; torch counts a function
rank as done only when it returns), every rank's command line is this launcher's, and
the ranks inherit the agent's signal handlers until the gate installs its own. The agent
has torch's TCP store thread running when it forks (Python 3.12+ warns about forking a
threaded process): a rank forked while that thread holds a lock would wait for it
forever, so the ranks wait at a start line until the last one is forked, and only then
connect to the store (:class:`StartLine`): the thread is idle at every fork.
This is a CPU test tool: on a GPU node, use torchrun (CUDA cannot follow a fork).
The suite keeps one real ``torchrun`` launch per gate (tests/gates/conftest.py), so the
documented command stays tested.

``--serve FD``: a launch server for the test workers (tests/gates/served_launch.py): it
imports torch, torch's launcher and every gate once, then forks one child per request,
which becomes this program for that launch (``launch(ARGV)``), so the agent's own
``import torch`` is not paid per launch either. A request's ``--preload`` module the
server lacks (megatron-core) is imported by the server before that fork, once.
"""

from __future__ import annotations

import functools
import importlib
import io
import json
import logging
import os
import signal
import socket
import sys
from typing import List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GATES = os.path.join(REPO, "gpu_gates")


def split_preloads(argv: List[str]) -> Tuple[List[str], List[str]]:
    """The leading ``--preload MODULE`` pairs, and the torchrun command line after them."""
    preload: List[str] = []
    while len(argv) >= 2 and argv[0] == "--preload":
        preload.append(argv[1])
        argv = argv[2:]
    return preload, argv


def gate_module(script: str) -> Optional[str]:
    """``gpu_gates.X`` for a script ``gpu_gates/X.py`` of this checkout, else None."""
    path = os.path.abspath(script)
    if os.path.dirname(path) == GATES and path.endswith(".py"):
        return "gpu_gates." + os.path.basename(path)[:-3]
    return None


def unbuffered_std_streams() -> None:
    """What torchrun's ``python -u`` gives each rank: stdout and stderr written at once,
    so a rank killed mid-run (``kill@POINT``) loses nothing it printed."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        old.flush()
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(
            sys,
            name,
            io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, line_buffering=False, write_through=True),
        )


class ExceptionTextUpFront(logging.Filter):
    """Render a log record's traceback before torch's log formatter sees the record.

    The agent logs a failed function rank with ``logger.exception`` (torchrun's program
    ranks get a plain error line), and torch's formatter imports ``torch._dynamo`` (about
    0.9 CPU s) just to decide whether to print a record's traceback, which it then does.
    Rendered here with the standard formatter, the printed text is the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            record.exc_text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True


class StartLine:
    """Forked ranks wait at a start line until the agent has forked the last of them.

    When the agent forks, its TCP store thread (torch's ``pt_tcpstore_uv``) is running,
    and it is busy exactly when the ranks already forked connect to the store, which
    they do at once. On each connection it formats the peer's address with glibc's
    ``getnameinfo`` (a reverse lookup: ``gethostbyaddr_r``, under the resolver's lock).
    A rank forked in that moment inherits the lock held, with no thread left to release
    it, and its own first ``getnameinfo`` (its ``TCPStore`` client's connect) waits for
    good: seen under load, the last of four ranks stuck in ``__resolv_context_get`` in
    its ``TCPStore`` constructor while the other three waited for it in
    ``init_process_group``. Held here until every rank is forked, no rank connects
    while the agent forks, so the thread sits idle in its event loop at each fork.

    A pipe: each rank closes its copy of the write end and reads until end of file,
    which comes when the agent closes its own (:meth:`release`)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()

    def hold(self) -> None:
        """In a rank: wait for the agent's release."""
        os.close(self._w)
        while os.read(self._r, 1):
            pass
        os.close(self._r)

    def release(self) -> None:
        """In the agent: let every rank go."""
        os.close(self._w)
        os.close(self._r)


def ranks_start_together(context_class) -> None:
    """Make ``context_class`` (torch's ``MultiprocessContext``, the agent's forked ranks)
    hold its ranks at a :class:`StartLine` until it has started them all."""
    start = context_class._start

    def _start(self) -> None:
        line, entrypoint = StartLine(), self.entrypoint

        @functools.wraps(entrypoint)
        def held(*args, **kwargs):
            line.hold()
            return entrypoint(*args, **kwargs)

        self.entrypoint = held
        try:
            start(self)
        finally:
            line.release()

    context_class._start = _start


def launch(argv: List[str]) -> None:
    """One launch: torchrun's own run, ranks forked (the command line of this module)."""
    preload, torchrun_argv = split_preloads(argv)
    if REPO not in sys.path:
        sys.path.insert(0, REPO)  # the gate modules, as the gate file's own sys.path line does
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.elastic.multiprocessing.errors import record

    args = torchrun.parse_args(torchrun_argv)
    args.run_path, args.start_method = True, "fork"
    args.training_script = os.path.abspath(args.training_script)  # --run-path wants it absolute
    gate = gate_module(args.training_script)
    for module in ([gate] if gate else []) + preload:
        importlib.import_module(module)
    unbuffered_std_streams()
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(ExceptionTextUpFront())
    ranks_start_together(MultiprocessContext)  # this process only: the agent of this launch
    record(torchrun.run)(args)


# ---------------------------------------------------------------------------------- serve
#: What a launch server imports at its start (``--serve``): torch's launcher and every gate.
#: What a gate's ranks import lazily comes with that gate's launches as ``--preload``
#: (tests/gates/conftest.py: ``PRELOAD``; torch._dynamo, about 1.1 CPU s, for the train-pump
#: gate only), imported by the server at the first such launch (:func:`_import_preloads`):
#: a server whose worker never launches that gate does not pay for it. A launch with
#: another PYTHONPATH is started as a program of its own (tests/gates/conftest.py decides).
SERVED_PRELOAD = ("torch.distributed.run", "torch.distributed.elastic.multiprocessing.errors")


def served_modules() -> List[str]:
    gates = sorted(n[:-3] for n in os.listdir(GATES) if n.endswith(".py") and not n.startswith("_"))
    return [*SERVED_PRELOAD, *(f"gpu_gates.{g}" for g in gates)]


def send_message(conn: socket.socket, message: dict, fds: Tuple[int, ...] = ()) -> None:
    """One JSON message (and file descriptors) on a SOCK_SEQPACKET socket: one packet each."""
    socket.send_fds(conn, [json.dumps(message).encode()], list(fds))


def receive_message(conn: socket.socket) -> Tuple[Optional[dict], List[int]]:
    """The next message and the descriptors it carried; (None, []) once the peer closed."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 22, 4)
    return (json.loads(data) if data else None), list(fds)


def _run_launch(request: dict, out_fd: int, inherited: Tuple[int, ...] = ()) -> None:
    """In a fresh fork of the server: become what ``python launch_forked.py ARGV`` would
    be (own session, the request's environment, folder and output), then launch.
    ``inherited``: the server's descriptors of other launches, closed first."""
    for fd in inherited:
        os.close(fd)
    os.setsid()  # own session and process group: the caller kills it, and finds what is left, by it
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    code = 0
    try:
        launch(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # what an uncaught exception does to a program: traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _import_preloads(argv: List[str]) -> None:
    """A launch's ``--preload`` modules, imported here once for it and every later launch
    (megatron-core: about 2 CPU s): modules are only ever added, and a launch cannot tell
    one the server imported from one its agent imports itself. One that fails to import is
    left to the launch, which fails on it as the program would."""
    for module in split_preloads(argv)[0]:
        if module not in sys.modules:
            try:
                importlib.import_module(module)
            except Exception:
                pass


def serve(fd: int) -> None:
    """Answer launch requests on the SOCK_SEQPACKET socket ``fd`` until it closes.

    A request (``{"argv", "env", "cwd"}``) carries two descriptors: the launch's output
    and its own reply socket, on which the server answers ``{"pid"}`` once it has forked
    the launch and ``{"exit_code"}`` once that launch has ended. Launches may overlap
    (the gate launches that mostly wait run side by side, tests/gates/test_gate_waits.py):
    each is watched through a pidfd. The server itself never launches, so every fork
    starts from the same state."""
    import select

    conn = socket.socket(fileno=fd)
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    for module in served_modules():
        importlib.import_module(module)
    send_message(conn, {"ready": os.getpid()})
    running: dict = {}  # pidfd -> (pid, reply socket)
    open_ = True
    while open_ or running:
        readable, _, _ = select.select(([conn] if open_ else []) + list(running), [], [])
        for ready in readable:
            if ready is conn:
                request, fds = receive_message(conn)
                if request is None:
                    open_ = False
                    continue
                out_fd, reply_fd = fds
                _import_preloads(request["argv"])
                inherited = [conn.fileno(), *running, *(r.fileno() for _, r in running.values()), reply_fd]
                pid = os.fork()
                if pid == 0:
                    _run_launch(request, out_fd, tuple(inherited))
                os.close(out_fd)
                reply = socket.socket(fileno=reply_fd)
                running[os.pidfd_open(pid)] = (pid, reply)
                send_message(reply, {"pid": pid})
            else:
                pid, reply = running.pop(ready)
                os.close(ready)
                _, status = os.waitpid(pid, 0)
                send_message(reply, {"exit_code": os.waitstatus_to_exitcode(status)})
                reply.close()


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        serve(int(argv[1]))
    else:
        launch(argv)


if __name__ == "__main__":
    main()

"""The package layers ("harness/ imports neither simulators/ nor gpu_gates/", harness/ is
clock- and transport-free, and its model core is free of every kind of I/O; docs/architecture.md).

``harness/`` is the clock-free core both runtimes interpret; ``gpu_gates/`` is the real-time
runtime and must not lean on the simulated one; ``rlharness/`` (the command line and the
pytest plugin) sits above all three and nothing below imports it. Every module is parsed
(nothing is imported) and every import in it counts: top-level, inside functions (the lazy
imports a command uses), relative ones resolved against the module's package, and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.

``harness/`` is also what both runtimes interpret, so it may not move bytes between
processes or read time itself: no module under it imports a transport (zmq, ray,
multiprocessing, socket, subprocess, mmap, torch.distributed, TransferQueue) or reads the wall
clock or sleeps (``time.time/monotonic/perf_counter/sleep``, ``datetime.now`` and kin, by
any alias). The real transports live in ``gpu_gates/transports/``.

Inside ``harness/``, the **model core** (everything but ``harness/logs/``: the scheduler, the
control logic, the protocols, the event log's vocabulary) is stricter still: no files (no
``open``, os, io, pathlib, shutil, tempfile, glob), no threads or event loops (threading,
concurrent, asyncio), no torch, no plotting, no signals, and nothing from ``harness/logs/``,
which reads and writes event logs and sits above the core.
"""

from __future__ import annotations

import ast
import functools
import os
import shutil
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: package -> top-level packages of this repository its modules may not import
FORBIDDEN = {
    "harness": ("simulators", "gpu_gates", "rlharness"),
    "gpu_gates": ("simulators", "rlharness"),
    "simulators": ("gpu_gates", "rlharness"),
}


def imported_names(source: str, module: str, is_package: bool = False) -> Iterator[Tuple[int, str]]:
    """(line, dotted name) of every import in ``source``, at any depth of the tree.

    ``module`` is the dotted name of the file (``harness.cli``) so relative imports can be
    resolved; ``is_package`` says the file is an ``__init__.py``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            yield node.lineno, name
            for alias in node.names:  # `from x import y`: y may be a module
                yield node.lineno, f"{name}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value


def modules_of(package: str, root: str = ROOT) -> Iterator[Tuple[str, str, bool]]:
    """(path, dotted module name, is_package) of every .py file under ``root/package/``."""
    for folder, dirs, files in os.walk(os.path.join(root, package)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                is_package = parts[-1] == "__init__"
                yield path, ".".join(parts[:-1] if is_package else parts), is_package


def layer_violations(source: str, module: str, forbidden: Tuple[str, ...], is_package: bool = False) -> List[str]:
    """One line per import statement that reaches a forbidden package (its module name)."""
    found = {}
    for line, name in imported_names(source, module, is_package):
        if name.split(".")[0] in forbidden:
            found.setdefault(line, name)
    return [f"{module}:{line} imports {name}" for line, name in sorted(found.items())]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_a_layer_above_or_beside_it(package):
    found = []
    count = 0
    for path, module, is_package in modules_of(package):
        with open(path, encoding="utf-8") as fh:
            found += layer_violations(fh.read(), module, FORBIDDEN[package], is_package)
        count += 1
    assert count > 10, f"{package}/ has only {count} modules: the scan looks in the wrong place"
    assert not found, "layering broken (harness/ imports neither simulators/ nor gpu_gates/):\n" + "\n".join(found)


def test_the_user_surface_lives_above_the_runtimes():
    # the command line and the pytest plugin need the simulator, so they are not in harness/
    for gone in ("cli.py", "cli_validate.py", "cli_export.py", "pytest_plugin.py"):
        assert not os.path.exists(os.path.join(ROOT, "harness", gone))
    with open(os.path.join(ROOT, "rlharness", "cli.py"), encoding="utf-8") as fh:
        names = {n for _, n in imported_names(fh.read(), "rlharness.cli")}
    assert any(n.startswith("simulators.") for n in names)  # the scan sees lazy imports in this file


LAZY = """
import os

def cmd():
    if True:
        from simulators.run import simulate
    return simulate
"""


@pytest.mark.parametrize(
    "source, module, is_package, expected",
    [
        (LAZY, "harness.x", False, ["harness.x:6 imports simulators.run"]),
        ("import gpu_gates.launch as g\n", "harness.x", False, ["harness.x:1 imports gpu_gates.launch"]),
        (
            "import importlib\ndef f():\n    return importlib.import_module('simulators.scenario.spec')\n",
            "harness.x",
            False,
            ["harness.x:3 imports simulators.scenario.spec"],
        ),
        ("x = __import__('gpu_gates')\n", "harness.x", False, ["harness.x:1 imports gpu_gates"]),
        ("from harness.logs.replay import replay_file\nfrom . import simulators_like\n", "harness.x", False, []),
    ],
)
def test_the_scan_finds_every_form_of_import(source, module, is_package, expected):
    assert layer_violations(source, module, FORBIDDEN["harness"], is_package) == expected


def test_relative_imports_resolve_against_the_package():
    names = [
        n for _, n in imported_names("from .. import limits\nfrom .cycle import plan\n", "harness.scheduler.model")
    ]
    assert names == ["harness", "harness.limits", "harness.scheduler.cycle", "harness.scheduler.cycle.plan"]
    names = [n for _, n in imported_names("from . import model\n", "harness.scheduler", is_package=True)]
    assert names == ["harness.scheduler", "harness.scheduler.model"]


# -- harness/ is clock- and I/O-free -----------------------------------------------------

#: modules (and their submodules) no module under harness/ may import or reach by attribute
IO_MODULES = (
    "zmq",
    "ray",
    "multiprocessing",
    "socket",
    "subprocess",
    "torch.distributed",
    "transfer_queue",
    "asyncio.subprocess",
    "mmap",
)

#: dotted names that read the wall clock (or a process clock) or sleep
CLOCK_NAMES = frozenset(
    [
        f"time.{f}"
        for f in (
            "time",
            "time_ns",
            "monotonic",
            "monotonic_ns",
            "perf_counter",
            "perf_counter_ns",
            "process_time",
            "process_time_ns",
            "thread_time",
            "thread_time_ns",
            "clock_gettime",
            "clock_gettime_ns",
            "sleep",
            "localtime",
            "gmtime",
            "ctime",
            "asctime",
        )
    ]
    + [f"datetime.datetime.{f}" for f in ("now", "utcnow", "today")]
    + ["datetime.date.today", "asyncio.sleep"]
)

#: harness module -> why it may do what the rule forbids. Empty: no module needs an exception.
IO_EXCEPTIONS: Dict[str, str] = {}


def _bound_names(tree: ast.AST) -> Dict[str, str]:
    """Local name -> the dotted name it stands for, from every import in the module
    (``import time as t`` -> t: time; ``from datetime import datetime`` -> datetime:
    datetime.datetime; ``import torch.distributed`` -> torch: torch)."""
    bound: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _dotted(node: ast.Attribute, bound: Dict[str, str]) -> str:
    """``t.monotonic`` -> ``time.monotonic`` when ``t`` is bound to ``time``; "" otherwise."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return ""
    return ".".join([bound[node.id]] + attrs[::-1])


def _forbidden(name: str) -> str:
    """Why the dotted ``name`` is forbidden in harness/, or ""."""
    if name in CLOCK_NAMES:
        return "reads the clock or sleeps"
    if any(name == m or name.startswith(m + ".") for m in IO_MODULES):
        return "is a transport"
    return ""


@functools.lru_cache(maxsize=None)  # a pure function of the text: an unchanged copied module is not parsed again
def io_violations(source: str, module: str, is_package: bool = False) -> List[str]:
    """One line per source line of ``module`` that imports a transport or reads the clock."""
    tree = ast.parse(source)
    found: Dict[int, str] = {}
    for line, name in imported_names(source, module, is_package):
        why = _forbidden(name)
        if why:
            found.setdefault(line, f"imports {name} ({why})")
    bound = _bound_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node, bound)
            why = _forbidden(name) if name else ""
            if why:
                found.setdefault(node.lineno, f"uses {name} ({why})")
    return [f"{module}:{line} {what}" for line, what in sorted(found.items())]


def harness_io_violations(root: str) -> Tuple[int, List[str]]:
    """(modules scanned, violations) for the harness/ package under ``root``."""
    found: List[str] = []
    count = 0
    for path, module, is_package in modules_of("harness", root):
        count += 1
        if module in IO_EXCEPTIONS:
            continue
        with open(path, encoding="utf-8") as fh:
            found += io_violations(fh.read(), module, is_package)
    return count, found


#: the model core: every module under harness/ outside this folder
LOGS_PACKAGE = "harness.logs"

#: modules (and their submodules) no module of the model core may import, beyond IO_MODULES
CORE_FORBIDDEN = (
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "threading",
    "_thread",
    "concurrent",
    "asyncio",
    "torch",
    "matplotlib",
    "signal",
    "gc",
    LOGS_PACKAGE,
)


def _in_core(module: str) -> bool:
    return module.startswith("harness") and not (module == LOGS_PACKAGE or module.startswith(LOGS_PACKAGE + "."))


@functools.lru_cache(maxsize=None)
def core_violations(source: str, module: str, is_package: bool = False) -> List[str]:
    """One line per source line of a model-core ``module`` that does I/O, starts threads, uses
    torch or plotting, or reaches into ``harness/logs/``."""
    found: Dict[int, str] = {}
    for line, name in imported_names(source, module, is_package):
        hit = next((m for m in CORE_FORBIDDEN if name == m or name.startswith(m + ".")), "")
        if hit:
            found.setdefault(line, f"imports {name} (the model core may not use {hit})")
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("open", "print", "input")
        ):
            found.setdefault(node.lineno, f"calls {node.func.id}() (the model core does no I/O)")
    return [f"{module}:{line} {what}" for line, what in sorted(found.items())]


def harness_core_violations(root: str) -> Tuple[int, List[str]]:
    """(core modules scanned, violations) for the model core under ``root``."""
    found: List[str] = []
    count = 0
    for path, module, is_package in modules_of("harness", root):
        if not _in_core(module):
            continue
        count += 1
        with open(path, encoding="utf-8") as fh:
            found += core_violations(fh.read(), module, is_package)
    return count, found


def test_the_model_core_does_no_io_and_uses_no_threads_torch_or_plotting():
    count, found = harness_core_violations(ROOT)
    assert count > 40, f"the model core has only {count} modules: the scan looks in the wrong place"
    assert not found, (
        "harness/'s model core must stay free of I/O, threads, torch and plotting (file I/O "
        "belongs in harness/logs/, real runtimes in simulators/ or gpu_gates/):\n" + "\n".join(found)
    )


def test_the_log_readers_are_their_own_folder_above_the_core():
    logs = [m for _, m, _ in modules_of("harness", ROOT) if not _in_core(m)]
    assert {f"{LOGS_PACKAGE}.{n}" for n in ("invariants", "outputs", "replay", "importers", "writer")} <= set(logs)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import threading\n", "imports threading (the model core may not use threading)"),
        ("import torch\n", "imports torch (the model core may not use torch)"),
        ("def f():\n    import matplotlib.pyplot as plt\n    return plt\n", "imports matplotlib.pyplot"),
        ("def f(p):\n    with open(p) as fh:\n        return fh.read()\n", "calls open()"),
        ("from pathlib import Path\n", "imports pathlib (the model core may not use pathlib)"),
        ("from harness.logs.writer import EventLog\n", "imports harness.logs.writer"),
        ("from concurrent.futures import ThreadPoolExecutor\n", "imports concurrent.futures"),
    ],
)
def test_the_core_scan_fires_on_each_kind_of_io(source, expected):
    found = core_violations(source, "harness.control.x")
    assert len(found) == 1 and expected in found[0], found


def test_the_core_scan_accepts_pure_code():
    assert (
        core_violations(
            "import math\nfrom harness.scheduler.types import Priority\nx = math.ceil(1.5)\n", "harness.control.x"
        )
        == []
    )


def test_harness_imports_no_transport_and_reads_no_clock():
    count, found = harness_io_violations(ROOT)
    assert count > 50, f"harness/ has only {count} modules: the scan looks in the wrong place"
    assert not found, (
        "harness/ must stay clock- and I/O-free (move real transports to gpu_gates/transports/, "
        "or list an exception with its reason in IO_EXCEPTIONS):\n" + "\n".join(found)
    )


def test_every_exception_names_a_module_that_exists_and_a_reason():
    modules = {m for _, m, _ in modules_of("harness", ROOT)}
    for module, reason in IO_EXCEPTIONS.items():
        assert module in modules and len(reason.split()) >= 4, (module, reason)


#: (what is planted, where in the module it goes, what the check must say)
PLANTS = [
    ("import zmq\n", "top", "imports zmq (is a transport)"),
    ("import time\n\ndef _planted():\n    time.sleep(0.01)\n", "bottom", "uses time.sleep"),
    ("from time import perf_counter as _pc\n", "bottom", "imports time.perf_counter"),
    (
        "import datetime as _dt\n\ndef _planted():\n    return _dt.datetime.now()\n",
        "bottom",
        "uses datetime.datetime.now",
    ),
    ("def _planted():\n    import torch.distributed as dist\n    return dist\n", "bottom", "imports torch.distributed"),
    (
        "import torch\n\ndef _planted(t):\n    torch.distributed.broadcast(t, 0)\n",
        "bottom",
        "uses torch.distributed.broadcast",
    ),
    (
        "def _planted():\n    from multiprocessing.managers import BaseManager\n    return BaseManager\n",
        "bottom",
        "imports multiprocessing.managers",
    ),
]


@pytest.mark.parametrize("plant, where, message", PLANTS, ids=[p[2].split(" (")[0] for p in PLANTS])
def test_a_planted_transport_or_clock_in_a_copy_of_harness_fails_the_check(tmp_path, plant, where, message):
    """The real check, run on a copy of harness/ in which one real module gained the plant."""
    shutil.copytree(
        os.path.join(ROOT, "harness"), tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__", "*.json")
    )
    target = tmp_path / "harness" / "refit" / "stream.py"
    source = target.read_text(encoding="utf-8")
    assert harness_io_violations(str(tmp_path)) == harness_io_violations(ROOT)  # the copy is clean as it stands
    if where == "top":
        head, _, rest = source.partition("from __future__ import annotations\n")
        source = head + "from __future__ import annotations\n" + plant + rest
    else:
        source = source + "\n\n" + plant
    target.write_text(source, encoding="utf-8")
    _, found = harness_io_violations(str(tmp_path))
    assert len(found) == 1 and found[0].startswith("harness.refit.stream:") and message in found[0], found


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import time as t\nx = t.monotonic()\n", ["harness.x:2 uses time.monotonic (reads the clock or sleeps)"]),
        (
            "from datetime import date\nd = date.today()\n",
            ["harness.x:2 uses datetime.date.today (reads the clock or sleeps)"],
        ),
        ("import socket\n", ["harness.x:1 imports socket (is a transport)"]),
        ("import importlib\nz = importlib.import_module('zmq')\n", ["harness.x:2 imports zmq (is a transport)"]),
        # not forbidden: a name that merely looks like one, a clock the runtime passes in, threading's lock
        ("import threading\nlock = threading.Lock()\n", []),
        ("def f(now):\n    return now.monotonic()\n", []),
        ("from harness.control.effects import Sleep\nx = Sleep\n", []),
        ("import torch\nx = torch.distributions\n", []),
    ],
)
def test_the_clock_and_transport_scan_resolves_aliases(source, expected):
    assert io_violations(source, "harness.x") == expected

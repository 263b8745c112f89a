"""The package layers ("harness/ imports neither simulators/ nor gpu_gates/"; docs/architecture.md).

``harness/`` is the clock-free core both runtimes interpret; ``gpu_gates/`` is the real-time
runtime and must not lean on the simulated one; ``rlharness/`` (the command line and the
pytest plugin) sits above all three and nothing below imports it. Every module is parsed
(nothing is imported) and every import in it counts: top-level, inside functions (the lazy
imports a command uses), relative ones resolved against the module's package, and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
"""

from __future__ import annotations

import ast
import os
from typing import Iterator, List, Tuple

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
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value


def modules_of(package: str) -> Iterator[Tuple[str, str, bool]]:
    """(path, dotted module name, is_package) of every .py file under ``package/``."""
    for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
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


LAZY = '''
import os

def cmd():
    if True:
        from simulators.run import simulate
    return simulate
'''


@pytest.mark.parametrize("source, module, is_package, expected", [
    (LAZY, "harness.x", False, ["harness.x:6 imports simulators.run"]),
    ("import gpu_gates.launch as g\n", "harness.x", False, ["harness.x:1 imports gpu_gates.launch"]),
    ("import importlib\ndef f():\n    return importlib.import_module('simulators.spec')\n", "harness.x", False,
     ["harness.x:3 imports simulators.spec"]),
    ("x = __import__('gpu_gates')\n", "harness.x", False, ["harness.x:1 imports gpu_gates"]),
    ("from harness.replay import replay_file\nfrom . import simulators_like\n", "harness.x", False, []),
])
def test_the_scan_finds_every_form_of_import(source, module, is_package, expected):
    assert layer_violations(source, module, FORBIDDEN["harness"], is_package) == expected


def test_relative_imports_resolve_against_the_package():
    names = [n for _, n in imported_names("from .. import replay\nfrom .cycle import plan\n", "harness.scheduler.model")]
    assert names == ["harness", "harness.replay", "harness.scheduler.cycle", "harness.scheduler.cycle.plan"]
    names = [n for _, n in imported_names("from . import model\n", "harness.scheduler", is_package=True)]
    assert names == ["harness.scheduler", "harness.scheduler.model"]

"""Field-level checks shared by every section of a scenario file: one-line errors and typed values.

:class:`ScenarioError` is the one error a bad scenario raises (its ``str`` is a single line
naming the file, the field path and the problem); :class:`Ctx` binds it to a source label,
and the helpers below check one value against its :class:`~simulators.scenario.rules.Rule`
(type, bound, unit) so that every section of the loader words its problems alike.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from simulators.scenario.rules import FIELD_RULES, Rule

__all__ = [
    "Ctx",
    "ScenarioError",
    "as_mapping",
    "check_value",
    "describe",
    "flat_fields",
    "fmt_num",
    "gpu_list",
    "join_path",
    "reject_unknown",
]


class ScenarioError(ValueError):
    """A scenario file or mapping is unusable; ``str`` is a single line.

    ``source`` is the file (or label) the scenario came from, ``path`` the dotted field
    path (``pipelines[1].infer_gpus``; ``None`` for file-level problems), ``line`` the
    1-based YAML line for malformed YAML, ``problem`` the bare description.
    """

    def __init__(self, source: str, path: Optional[str], problem: str, *, line: Optional[int] = None):
        problem = " ".join(str(problem).split())  # exactly one line, whatever the cause said
        if line is not None:
            text = f"{source}:{line}: {problem}"
        elif path is not None:
            text = f"{source}: {path}: {problem}"
        else:
            text = f"{source}: {problem}"
        super().__init__(text)
        self.source = source
        self.path = path
        self.problem = problem
        self.line = line


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return repr(value)


def fmt_num(x: Union[int, float]) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x)) if abs(x) < 1e6 else f"{x:g}"
    return f"{x:g}" if isinstance(x, float) else str(x)


class Ctx:
    """Error factory bound to one source label."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: Optional[str], problem: str) -> ScenarioError:
        return ScenarioError(self.source, path, problem)


def check_value(ctx: Ctx, path: str, value: Any, rule: Rule) -> Any:
    unit = f" ({rule.unit})" if rule.unit else ""
    if rule.kind == "str":
        if not isinstance(value, str):
            raise ctx.fail(path, f"expected a string, got {describe(value)}")
        return value
    if rule.kind == "bool":
        if not isinstance(value, bool):
            raise ctx.fail(path, f"expected true or false, got {describe(value)}")
        return value
    if rule.kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise ctx.fail(path, f"expected an integer{unit}, got {describe(value)}")
        x: Union[int, float] = value
    else:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ctx.fail(path, f"expected a number{unit}, got {describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ctx.fail(path, f"must be a finite number{unit}, got {value!r}")
        x = float(value)
    bad = {
        ">0": x <= 0,
        ">=0": x < 0,
        ">=1": x < 1,
        "(0,1]": not (0 < x <= 1),
        "": False,
    }[rule.bound]
    if bad:
        need = {">0": "> 0", ">=0": ">= 0", ">=1": ">= 1", "(0,1]": "in (0, 1]"}[rule.bound]
        raise ctx.fail(path, f"must be {need}{unit}, got {fmt_num(value)}")
    return x


def as_mapping(ctx: Ctx, path: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ctx.fail(path, f"expected a mapping, got {describe(value)}")
    for key in value:
        if not isinstance(key, str):
            raise ctx.fail(path, f"keys must be strings, got {describe(key)}")
    return value


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def reject_unknown(ctx: Ctx, path: str, data: Mapping[str, Any], known: Tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            shown = str(key) if str(key).isprintable() else repr(str(key))  # a "\n" key stays one line
            raise ctx.fail(join_path(path, shown), f"unknown field; known: {', '.join(sorted(known))}")


def flat_fields(ctx: Ctx, path: str, data: Mapping[str, Any], cls: type) -> Dict[str, Any]:
    """Validate the fields of a flat dataclass (all entries in FIELD_RULES) present in ``data``."""
    rules = FIELD_RULES[cls]
    data = as_mapping(ctx, path, data)
    reject_unknown(ctx, path, data, tuple(rules))
    return {k: check_value(ctx, join_path(path, k), v, rules[k]) for k, v in data.items()}


def gpu_list(ctx: Ctx, path: str, value: Any, num_gpus: int) -> List[int]:
    if not isinstance(value, (list, tuple)):
        raise ctx.fail(path, f"expected a list of GPU ids, got {describe(value)}")
    if not value:
        raise ctx.fail(path, "must list at least one GPU")
    for i, g in enumerate(value):
        if not isinstance(g, int) or isinstance(g, bool):
            raise ctx.fail(f"{path}[{i}]", f"expected an integer GPU id, got {describe(g)}")
    outside = sorted({g for g in value if g < 0 or g >= num_gpus})
    if outside:
        ids = ", ".join(str(g) for g in outside)
        noun = "GPU" if len(outside) == 1 else "GPUs"
        raise ctx.fail(path, f"{noun} {ids} outside the cluster (0..{num_gpus - 1})")
    return list(value)

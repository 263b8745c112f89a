"""``--set PATH=VALUE``: change one field of a scenario from the command line.

A what-if should not mean copying a YAML file and editing it with sed. ``PATH`` is written
the way the scenario's own error messages write a field (``pipelines[1].infer_tp``,
``costs.wake_s``, ``scheduler.head_of_line_blocking``), so an error message can be pasted
back as a ``--set``; a pipeline (or any list item with a ``name``) may also be picked by
name: ``pipelines[ppl2].steps``. ``VALUE`` is read as YAML (``4``, ``0.5e9``, ``true``,
``[0, 1]``, ``{params: 7e9}``) with the scenario loader's own strict rules.

Overrides are applied to the scenario *mapping* before it is loaded, so every value goes
through the same validation as a value in the file, and a bad one is reported under its
field path like any other.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence, Tuple, Union

from simulators.scenario.yaml_dialect import strict_safe_load

Step = Union[str, int]  # a mapping key, or a list index (an int) or item name (a str in [...])

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_STEP_RE = re.compile(rf"({_NAME})|\[([^\[\]]+)\]")


class OverrideError(ValueError):
    """A ``--set`` that cannot be applied; ``str`` is one line naming the flag and path."""


@dataclass(frozen=True)
class Override:
    text: str  # PATH=VALUE as given
    path: str  # PATH as given
    steps: Tuple[Tuple[str, Step], ...]  # ("key", name) | ("index", int) | ("named", name)
    value: Any


def parse_path(path: str, flag: str = "--set") -> Tuple[Tuple[str, Step], ...]:
    """``pipelines[1].model.params`` -> (("key","pipelines"), ("index",1), ("key","model"), ...)."""
    steps: List[Tuple[str, Step]] = []
    pos = 0
    while pos < len(path):
        if steps and path[pos] == ".":
            pos += 1
        m = _STEP_RE.match(path, pos)
        if m is None or (m.group(1) is not None and steps and path[pos - 1] != "."):
            raise OverrideError(
                f"{flag} {path}: cannot read the path at {path[pos:]!r} "
                "(write it as the error messages do, e.g. pipelines[0].infer_tp)"
            )
        if m.group(1) is not None:
            steps.append(("key", m.group(1)))
        else:
            inner = m.group(2).strip()
            steps.append(("index", int(inner)) if re.fullmatch(r"-?\d+", inner) else ("named", inner))
        pos = m.end()
    if not steps or steps[0][0] != "key" or path.endswith("."):
        raise OverrideError(f"{flag} {path}: a path starts with a top-level field name (e.g. costs.wake_s)")
    return tuple(steps)


def parse_override(text: str, flag: str = "--set") -> Override:
    """One ``PATH=VALUE``; the value read as YAML."""
    path, sep, raw = text.partition("=")
    path = path.strip()
    if not sep or not path:
        raise OverrideError(f"{flag} {text}: expected PATH=VALUE (e.g. pipelines[0].steps=8)")
    return Override(text, path, parse_path(path, flag), _yaml_value(raw, f"{flag} {path}"))


def _yaml_value(raw: str, where: str) -> Any:
    try:
        return strict_safe_load(raw) if raw.strip() else ""
    except Exception as e:  # yaml's errors are multi-line: keep the first line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OverrideError(f"{where}: the value {raw!r} is not valid YAML: {first}") from None


def split_values(raw: str) -> List[str]:
    """``1,2,[0,1]`` -> ["1", "2", "[0,1]"]: commas inside brackets, braces or quotes stay."""
    out, depth, quote, cur = [], 0, "", []
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return out


def apply_overrides(mapping: Mapping[str, Any], overrides: Sequence[Override]) -> dict:
    """A deep copy of ``mapping`` with each override set, in order; intermediate mappings
    that the file leaves out (``costs`` in a file without one) are created."""
    data = copy.deepcopy(dict(mapping))
    for ov in overrides:
        _set(data, ov)
    return data


def _set(root: dict, ov: Override) -> None:
    node: Any = root
    where = ""
    for i, (kind, step) in enumerate(ov.steps):
        last = i == len(ov.steps) - 1
        if kind == "key":
            if not isinstance(node, dict):
                raise OverrideError(
                    f"--set {ov.path}: {where or 'the scenario'} is not a mapping, so it has no field {step!r}"
                )
            if last:
                node[step] = copy.deepcopy(ov.value)
                return
            if node.get(step) is None:
                node[step] = {} if ov.steps[i + 1][0] == "key" else []
            node, where = node[step], f"{where}.{step}" if where else str(step)
            continue
        if not isinstance(node, list):
            raise OverrideError(f"--set {ov.path}: {where} is not a list")
        index = _index(node, kind, step, ov.path, where)
        if last:
            node[index] = copy.deepcopy(ov.value)
            return
        node, where = node[index], f"{where}[{step}]"


def _index(items: list, kind: str, step: Step, path: str, where: str) -> int:
    if kind == "index":
        assert isinstance(step, int)
        if not -len(items) <= step < len(items):
            raise OverrideError(f"--set {path}: {where} has {len(items)} item(s), no item {step}")
        return step
    names = [it.get("name") for it in items if isinstance(it, dict)]
    for i, it in enumerate(items):
        if isinstance(it, dict) and it.get("name") == step:
            return i
    raise OverrideError(
        f"--set {path}: {where} has no item named {step!r} (names: {', '.join(map(str, names)) or 'none'})"
    )


def describe(overrides: Sequence[Override]) -> str:
    """How a run's settings read in a table or a label: ``a=1 b=2``."""
    return " ".join(f"{ov.path}={_short(ov.value)}" for ov in overrides) or "(as in the file)"


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e6:
        return f"{value:g}"
    return str(value).replace(" ", "")


def scenario_mapping(path: Union[str, None]) -> Tuple[dict, str]:
    """The mapping a scenario file holds (the default scenario's without a file), and its
    source label; a file that cannot be read or parsed raises ``ScenarioError``."""
    from simulators.scenario.loader import read_mapping
    from simulators.scenario.dump import scenario_to_mapping
    from simulators.scenario.spec import default_scenario

    if path is None:
        return scenario_to_mapping(default_scenario()), "default scenario"
    return read_mapping(path), str(path)


def load_with_overrides(path: Union[str, None], overrides: Sequence[Override]):
    """Load a scenario (or the default one) with ``overrides`` applied before validation;
    a value they make invalid is reported under its field path, marked as set by --set."""
    from simulators.scenario.loader import check_feasible, load_scenario, scenario_from_mapping
    from simulators.scenario.spec import default_scenario

    if not overrides:
        return load_scenario(path) if path is not None else default_scenario()
    mapping, source = scenario_mapping(path)
    source = f"{source} with --set"
    scenario = scenario_from_mapping(apply_overrides(mapping, overrides), source)
    check_feasible(scenario, source)  # a value set here can make the layout infeasible too
    return scenario

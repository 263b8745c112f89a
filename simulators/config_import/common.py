"""What every config importer shares: reading a config as its system reads it, the
refusal that names a key, the model presets by Hugging Face name, and the check that
the written scenario loads.

Configs are read as NeMo RL and ROLL read them with OmegaConf (NeMo RL's
``nemo_rl/utils/config.py``, ROLL through Hydra): mappings merge key by key, overrides
are Hydra's, interpolations (``${policy.model_name}``, ``${.temperature}``, NeMo RL's
``${mul:a,b}``) resolve to what OmegaConf gives. The few OmegaConf rules these configs use
are implemented here on plain dicts, and a key is resolved only when the translation
reads it: OmegaConf's own node objects made reading the 400 pinned configs take a minute.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from simulators.config_import.draft import ScenarioDraft


class ConfigRefused(Exception):
    """The config asks for something a scenario cannot represent (or is not a config of
    that kind): ``key`` is the config key to look at, ``problem`` why."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


_RESOLVERS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}


_PARSED: Dict[Tuple[str, float], Any] = {}


def _config_loader():
    """PyYAML's safe loader reading ``1e-8`` as a float, as OmegaConf's loader does (YAML
    1.1 reads it as text); merge keys (``<<: *BASE`` then a key of its own) are YAML's,
    so the scenario dialect's duplicate-key rule does not apply to a config."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return Loader


def load_yaml(path: str, key: str = "(file)") -> Dict[str, Any]:
    """One YAML file as a fresh dict (parsed once per file and change time: recipes share
    their parents); an unreadable or non-mapping file is refused."""
    import copy

    import yaml

    from simulators.scenario.yaml_dialect import ScenarioTextError, read_scenario_text

    shown = os.path.basename(path)
    try:
        stamp = (os.path.realpath(path), os.stat(path).st_mtime)
    except OSError:
        raise ConfigRefused(key, f"{shown}: no such file") from None
    if stamp not in _PARSED:
        try:
            _PARSED[stamp] = yaml.load(read_scenario_text(path), Loader=_config_loader())
        except (ScenarioTextError, OSError) as e:
            raise ConfigRefused(key, f"{shown}: cannot read: {e}") from None
        except Exception as e:  # yaml's errors: the file is not a config
            raise ConfigRefused(key, f"{shown}: cannot parse: {' '.join(str(e).split())[:200]}") from None
    node = _PARSED[stamp]
    if not isinstance(node, dict):
        raise ConfigRefused(key, f"{shown}: not a mapping")
    return copy.deepcopy(node)


def merge(base: Dict[str, Any], child: Dict[str, Any]) -> Dict[str, Any]:
    """OmegaConf.merge on plain dicts: mappings merge key by key, anything else (a list,
    a scalar, null) replaces; a child section with ``_override_: true`` replaces the
    base's whole (NeMo RL's ``merge_with_override``)."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and value.get("_override_", False):
            out[key] = {k: v for k, v in value.items() if k != "_override_"}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(cfg: Dict[str, Any], overrides: Iterable[str]) -> Dict[str, Any]:
    """Hydra-style command-line overrides as NeMo RL and RLix pass them: ``a.b=V`` sets an
    existing key, ``+a.b=V`` adds a new one, ``++a.b=V`` sets or adds, ``~a.b`` deletes;
    ``V`` is YAML."""
    import yaml

    for text in overrides:
        text = str(text)
        mode = "~" if text.startswith("~") else "++" if text.startswith("++") else "+" if text.startswith("+") else ""
        dotted, sep, raw = text[len(mode) :].partition("=")
        if not dotted or (not sep and mode != "~"):
            raise ConfigRefused(text, "an override is KEY=VALUE, +KEY=VALUE, ++KEY=VALUE or ~KEY")
        *parents, leaf = dotted.split(".")
        node: Any = cfg
        for part in parents:
            if not isinstance(node.get(part), dict):
                if mode in ("", "~"):
                    raise ConfigRefused(dotted, f"override {text!r}: the config has no section {part!r}")
                node[part] = {}
            node = node[part]
        exists = leaf in node
        if mode == "~":
            if not exists:
                raise ConfigRefused(dotted, f"override {text!r} deletes a key the config does not have")
            del node[leaf]
            continue
        if mode == "" and not exists:
            raise ConfigRefused(dotted, f"override {text!r} sets a key the config does not have (add it with +)")
        if mode == "+" and exists:
            raise ConfigRefused(dotted, f"override {text!r} adds a key the config already has (set it without +)")
        try:
            node[leaf] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            node[leaf] = raw
    return cfg


def _split_top(text: str, sep: str = ",") -> List[str]:
    """``text`` split at ``sep`` outside ``${...}``."""
    parts, depth, cur = [], 0, ""
    i = 0
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            cur += "${"
            i += 2
            continue
        ch = text[i]
        if ch == "}" and depth:
            depth -= 1
        if ch == sep and not depth:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    parts.append(cur)
    return parts


def _interpolations(text: str) -> List[Tuple[int, int]]:
    """(start, end) of each top-level ``${...}`` in ``text``."""
    spans, i = [], 0
    while True:
        start = text.find("${", i)
        if start < 0:
            return spans
        depth, j = 0, start
        while j < len(text):
            if text.startswith("${", j):
                depth += 1
                j += 2
                continue
            if text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        if depth:
            raise ValueError(f"unclosed interpolation in {text!r}")
        spans.append((start, j + 1))
        i = j + 1


def _resolve_value(root: Dict[str, Any], value: Any, here: List[str], depth: int = 0) -> Any:
    """A config value with its OmegaConf interpolations resolved as OmegaConf resolves them:
    ``${a.b}`` (absolute), ``${.x}`` / ``${..x}`` (relative to the key's section), NeMo RL's
    ``${mul:a,b}`` family and ``${oc.env:NAME,default}``; a whole-string interpolation keeps
    its type, an embedded one becomes text."""
    import yaml

    if not isinstance(value, str) or "${" not in value:
        return value
    if depth > 32:
        raise ValueError("interpolation nested deeper than 32 (a cycle?)")
    spans = _interpolations(value)
    out, last, results = "", 0, []
    for start, end in spans:
        body = value[start + 2 : end - 1].strip()
        head, colon, rest = body.partition(":")
        if colon and (head in _RESOLVERS or head == "oc.env"):
            args = [_resolve_value(root, a.strip(), here, depth + 1) for a in _split_top(rest)]
            args = [yaml.safe_load(a) if isinstance(a, str) and "${" not in a and a else a for a in args]
            if head == "oc.env":
                env = os.environ.get(str(args[0]))
                if env is None and len(args) < 2:
                    raise ValueError(f"environment variable {args[0]!r} not set")
                result = env if env is not None else args[1]
            else:
                result = _RESOLVERS[head](*args)
        elif colon:
            raise ValueError(f"unknown resolver {head!r}")
        else:
            dots = len(body) - len(body.lstrip("."))
            parts = body.lstrip(".").split(".") if body.lstrip(".") else []
            path = (here[: len(here) - (dots - 1)] if dots else []) + parts  # '.' = the key's own section
            node: Any = root
            for part in path:
                if not isinstance(node, dict) or part not in node:
                    raise ValueError(f"interpolation key {'.'.join(path)!r} not found")
                node = node[part]
            result = _resolve_value(root, node, path[:-1], depth + 1)
        results.append(result)
        out += value[last:start] + str(result)
        last = end
    if len(spans) == 1 and spans[0] == (0, len(value)):
        return results[0]
    return out + value[last:]


_MISSING = object()


def get(cfg: Dict[str, Any], dotted: str, default: Any = _MISSING) -> Any:
    """``cfg[a][b]...`` for ``"a.b"``, its interpolations resolved (only the keys read are
    resolved: a key the translation never reads cannot refuse a config); a missing key (or
    a ``null`` parent) gives ``default``, or is refused when no default is given."""
    node: Any = cfg
    parts = dotted.split(".")
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            if default is _MISSING:
                raise ConfigRefused(dotted, "missing (required to build a scenario)")
            return default
        node = node[part]
    try:
        return _resolve_value(cfg, node, parts[:-1])
    except (ValueError, TypeError, ArithmeticError) as e:
        raise ConfigRefused(dotted, f"cannot resolve {node!r}: {e}") from None


def typed(cfg: Dict[str, Any], dotted: str, kind: type, default: Any = _MISSING) -> Any:
    value = get(cfg, dotted, default)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind if kind is not float else (int, float)):
        if value is None and default is not _MISSING:
            return default
        raise ConfigRefused(dotted, f"expected {kind.__name__}, got {value!r}")
    return value


#: Hugging Face repository names (lower case) -> the model preset with that architecture
#: (simulators/costmodel/models.py); a base model and its instruct tune share one
_PRESET_ALIASES = {
    "qwen2.5-0.5b": ("qwen/qwen2.5-0.5b", "qwen/qwen2.5-0.5b-instruct"),
    "llama3.2-1b": ("meta-llama/llama-3.2-1b", "meta-llama/llama-3.2-1b-instruct"),
    "qwen2.5-1.5b": ("qwen/qwen2.5-1.5b", "qwen/qwen2.5-1.5b-instruct"),
    "qwen2.5-7b": ("qwen/qwen2.5-7b", "qwen/qwen2.5-7b-instruct"),
    "qwen2.5-32b": ("qwen/qwen2.5-32b", "qwen/qwen2.5-32b-instruct"),
    "qwen3-8b": ("qwen/qwen3-8b", "qwen/qwen3-8b-base"),
    "qwen3-32b": ("qwen/qwen3-32b",),
    "qwen3-30b-a3b": ("qwen/qwen3-30b-a3b", "qwen/qwen3-30b-a3b-base", "qwen/qwen3-30b-a3b-instruct-2507"),
    "qwen3-235b-a22b": ("qwen/qwen3-235b-a22b",),
    "llama3.1-8b": (
        "meta-llama/llama-3.1-8b",
        "meta-llama/llama-3.1-8b-instruct",
        "meta-llama/meta-llama-3.1-8b-instruct",
    ),
    "llama3.1-70b": (
        "meta-llama/llama-3.1-70b",
        "meta-llama/llama-3.1-70b-instruct",
        "meta-llama/llama-3.3-70b-instruct",
    ),
}
_BY_REPO = {repo: preset for preset, repos in _PRESET_ALIASES.items() for repo in repos}


def model_preset(name: Any, key: str) -> str:
    """The preset whose architecture ``name`` (a Hugging Face repository) has, or a refusal."""
    preset = _BY_REPO.get(str(name).strip().lower())
    if preset is None:
        raise ConfigRefused(
            key,
            f"model {name!r} has no preset with its architecture (simulators/costmodel/models.py: "
            f"{', '.join(sorted(_PRESET_ALIASES))}); add one, or write the scenario's model by hand",
        )
    return preset


def scenario_name(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-") or "imported"
    return name[:128]


_RANGE = re.compile(r"^\s*list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?\)\s*\)\s*$")
_LIST = re.compile(r"^\s*(?:list\(\s*)?\[\s*((?:\d+\s*,\s*)*\d*\s*,?)\s*\](?:\s*\))?\s*$")


def device_mapping(value: Any, key: str) -> List[int]:
    """ROLL's and RLix's device_mapping: a list, ``"[0, 1, ]"`` or ``list(range(a, b))``
    (ROLL evaluates the string; here only these two forms are read, nothing is evaluated)."""
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        gpus = list(value)
    elif isinstance(value, str) and _RANGE.match(value):
        a, b, c = _RANGE.match(value).groups()
        gpus = list(range(int(a), int(b)) if b else range(int(a)))
        if c:
            gpus = list(range(int(a), int(b), int(c)))
    elif isinstance(value, str) and _LIST.match(value):
        gpus = [int(x) for x in _LIST.match(value).group(1).replace(" ", "").split(",") if x]
    else:
        raise ConfigRefused(key, f"expected a GPU list, '[0, 1, ]' or 'list(range(a, b))', got {value!r}")
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise ConfigRefused(key, f"expected distinct GPU ids >= 0, got {value!r}")
    return gpus


#: words of a loader problem -> the scenario field to blame (the one the message asks to change)
_BLAME = (
    ("raise infer_tp", "infer_tp"),
    ("tp_size", "infer_tp"),
    ("lower kv_cache_fraction", "costs.kv_cache_fraction"),
    ("kv_cache_fraction", "costs.kv_cache_fraction"),
)


def _blamed_key(draft: ScenarioDraft, field: str, problem: str) -> str:
    """The config key behind a field the loader rejected: the field the message asks to
    change when it names one (``raise infer_tp``), else the rejected field itself."""
    pipe = field.split(".", 1)[0] if field.startswith("pipelines[") else ""
    for words, target in _BLAME:
        if words in problem and pipe:
            src = draft.source_of(f"{pipe}.{target}")
            if src:
                return src
    return draft.source_of(field) or field or "(scenario)"


def start_draft(
    what: str, command: str, files: str, chain: Sequence[str], name: str, seed: Optional[Tuple[int, str]] = None
) -> ScenarioDraft:
    """A draft with the header every importer writes, its name, seed and horizon."""
    d = ScenarioDraft(
        [
            f"Imported from {what} {files}"
            + (f" (defaults: {', '.join(chain)})" if chain else "")
            + f" by rlharness import {command}.",
            "Each field's comment names the config key it came from; 'not in the config' marks a default.",
        ]
    )
    d.set(("name",), name, "the config file's name")
    if seed is not None:
        d.set(("seed",), seed[0], seed[1])
    d.set(("horizon_s",), 86400, "not in the config: one simulated day, the run stops there if steps remain")
    return d


def finish(draft: ScenarioDraft, source: str) -> Tuple[str, Any]:
    """The scenario text and its loaded :class:`Scenario`; a field the loader rejects is
    refused under the config key it came from. Feasibility is not checked here: a config
    that does not fit is still a scenario (``rlharness preflight`` says so, with the figure)."""
    from simulators.scenario.loader import ScenarioError, scenario_from_mapping

    try:
        scenario = scenario_from_mapping(draft.mapping(), source)
    except ScenarioError as e:
        field = getattr(e, "path", None) or ""
        key = _blamed_key(draft, field, e.problem)
        raise ConfigRefused(
            key.split(" ")[0], f"the scenario it gives is refused at {field or 'its top level'}: {e.problem}"
        ) from None
    return draft.text(), scenario


def first_present(cfg: Dict[str, Any], keys: Iterable[str]) -> Optional[str]:
    for k in keys:
        if get(cfg, k, None) not in (None, False, 0, {}, []):
            return k
    return None

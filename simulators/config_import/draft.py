"""A scenario being built from a config, each field with the config key it came from.

Why a draft and not a mapping: the written scenario must say, beside every derived value,
which key of the user's config gave it (or that no key did and a default stands), so a
reader can check the translation line by line. :meth:`ScenarioDraft.text` renders the
YAML with those comments; :meth:`ScenarioDraft.mapping` is what the loader validates.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

Path = Tuple[Any, ...]  # keys and list indices from the top, e.g. ("pipelines", 0, "infer_tp")


class ScenarioDraft:
    def __init__(self, header: List[str]) -> None:
        self.header = list(header)
        self.data: Dict[str, Any] = {}
        self.sources: Dict[Path, str] = {}

    def set(self, path: Path, value: Any, source: str) -> None:
        """Set the field at ``path`` and note ``source`` (the config key, or why a default)."""
        node: Any = self.data
        for key, nxt in zip(path[:-1], path[1:]):
            if isinstance(key, int):
                while len(node) <= key:
                    node.append({})
                node = node[key]
            else:
                node = node.setdefault(key, [] if isinstance(nxt, int) else {})
        last = path[-1]
        if isinstance(last, int):
            while len(node) <= last:
                node.append({})
        node[last] = value
        self.sources[tuple(path)] = source

    def source_of(self, dotted: str) -> Optional[str]:
        """The config key behind a scenario field as the loader names it (``pipelines[0].infer_tp``)."""
        for path, src in self.sources.items():
            if _dotted(path) == dotted:
                return src
        return None

    def mapping(self) -> Dict[str, Any]:
        return json.loads(json.dumps(self.data))

    def text(self) -> str:
        lines = [f"# {h}" if h else "#" for h in self.header]
        _render(self.data, (), 0, lines, self.sources)
        return "\n".join(lines) + "\n"


def _dotted(path: Path) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def _comment(sources: Dict[Path, str], path: Path) -> str:
    src = sources.get(path)
    return f"  # {src}" if src else ""


def _render(node: Dict[str, Any], path: Path, indent: int, lines: List[str], sources: Dict[Path, str]) -> None:
    pad = " " * indent
    for key, value in node.items():
        here = path + (key,)
        if isinstance(value, dict) and here not in sources:
            lines.append(f"{pad}{key}:{_comment(sources, here)}")
            _render(value, here, indent + 2, lines, sources)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and here not in sources:
            lines.append(f"{pad}{key}:")
            for i, item in enumerate(value):
                sub: List[str] = []
                _render(item, here + (i,), indent + 4, sub, sources)
                first = sub[0]
                sub[0] = pad + "  - " + first[indent + 4 :]
                lines.extend(sub)
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}{_comment(sources, here)}")

"""The import table: every config of the pinned upstream archives through its importer,
imported or refused with the key and the reason (docs/importers.md).

The archives are not part of the project. They are read from ``$RLHARNESS_UPSTREAM`` or
``../shared/upstream/`` beside the project root; without them the table cannot be built
and the test that compares it with the docs skips, saying how to point it at them.

    python -m simulators.config_import.table [--write docs/importers.md]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tarfile
import tempfile
from typing import Dict, List, NamedTuple, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEMO, ROLL = "nemo-rl-7ea279ab-configs.tar.gz", "roll-8eb27cc-example-configs.tar.gz"
RLIX = ("rlix-f77d913.tar.gz", "rlix-d455b0c.tar.gz", "rlix-a8460a9.tar.gz")
BEGIN, END = "<!-- import-table:begin -->", "<!-- import-table:end -->"


class Row(NamedTuple):
    archive: str
    config: str  # path inside the archive's folder (several joined by " + ")
    imported: bool
    key: str
    reason: str


def upstream_dir() -> Optional[str]:
    """Where the pinned archives are, or None (the caller skips with :data:`HOW`)."""
    where = os.environ.get("RLHARNESS_UPSTREAM") or os.path.join(ROOT, "..", "shared", "upstream")
    return where if all(os.path.isfile(os.path.join(where, a)) for a in (NEMO, ROLL) + RLIX) else None


HOW = (
    "the pinned upstream archives are not there: set RLHARNESS_UPSTREAM to a folder holding "
    f"{NEMO}, {ROLL} and {', '.join(RLIX)} (docs/importers.md)"
)


def _unpack(archive: str, dest: str) -> str:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
        top = tar.getnames()[0].split("/")[0]
    return os.path.join(dest, top)


def _one(archive: str, root: str, files: List[str], source: str, nemo_configs: Optional[str]) -> Row:
    from simulators.config_import import nemo_rl, rlix_pipelines, roll
    from simulators.config_import.common import ConfigRefused, finish

    shown = " + ".join(os.path.relpath(f, root) for f in files)
    try:
        if source == "nemo-rl-config":
            cfg, chain = nemo_rl.load(files[0])
            draft = nemo_rl.translate(cfg, files[0], chain, gpu="h100_sxm", steps=4)
        elif source == "roll-config":
            cfg, chain = roll.load(files[0])
            draft = roll.translate(cfg, files[0], chain, gpu="h100_sxm", steps=4)
        else:
            draft = rlix_pipelines.translate(files, gpu="h100_sxm", steps=4, nemo_configs=nemo_configs)
        finish(draft, shown)
    except ConfigRefused as e:
        return Row(archive, shown, False, e.key, e.problem)
    return Row(archive, shown, True, "", "")


def build(upstream: str) -> List[Row]:
    """Every pinned config through its importer (a crash propagates: it is a bug)."""
    rows: List[Row] = []
    with tempfile.TemporaryDirectory(prefix="rlharness-import-") as tmp:
        nemo_root = _unpack(os.path.join(upstream, NEMO), tmp)
        nemo_configs = os.path.join(nemo_root, "examples", "configs")
        for f in sorted(glob.glob(os.path.join(nemo_configs, "**", "*.yaml"), recursive=True)):
            rows.append(_one(NEMO, nemo_root, [f], "nemo-rl-config", None))
        roll_root = _unpack(os.path.join(upstream, ROLL), tmp)
        for f in sorted(glob.glob(os.path.join(roll_root, "examples", "**", "*.yaml"), recursive=True)):
            rows.append(_one(ROLL, roll_root, [f], "roll-config", None))
        for archive in RLIX:
            root = _unpack(os.path.join(upstream, archive), tmp)
            for first in sorted(glob.glob(os.path.join(root, "examples", "*", "*pipeline1*.yaml"))):
                pair = [first] + [f for f in (first.replace("pipeline1", "pipeline2"),) if os.path.isfile(f)]
                rows.append(_one(archive, root, pair, "rlix-pipelines", nemo_configs))
    return rows


def render(rows: List[Row]) -> str:
    by_archive: Dict[str, List[int]] = {}
    for r in rows:
        counts = by_archive.setdefault(r.archive, [0, 0])
        counts[0 if r.imported else 1] += 1
    out = [BEGIN, "", "| archive | imported | refused |", "|---|---|---|"]
    out += [f"| `{a}` | {c[0]} | {c[1]} |" for a, c in by_archive.items()]
    out += ["", "| archive | config | verdict | key | reason |", "|---|---|---|---|---|"]
    for r in rows:
        reason = r.reason.replace("|", "\\|")
        out.append(
            f"| {r.archive.split('-configs')[0].split('-example')[0].replace('.tar.gz', '')} | {r.config} | "
            + ("imported | | |" if r.imported else f"refused | `{r.key}` | {reason} |")
        )
    return "\n".join(out + ["", END])


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", metavar="DOC", help="replace the table between the markers in DOC")
    args = ap.parse_args(argv)
    upstream = upstream_dir()
    if upstream is None:
        print(f"error: {HOW}", file=sys.stderr)
        return 2
    table = render(build(upstream))
    if not args.write:
        print(table)
        return 0
    with open(args.write, encoding="utf-8") as fh:
        doc = fh.read()
    if BEGIN not in doc or END not in doc:
        print(f"error: {args.write}: no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    head, rest = doc.split(BEGIN, 1)
    with open(args.write, "w", encoding="utf-8") as fh:
        fh.write(head + table + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Every relative link and repository path the README and docs/ name exists.

A reader follows what the docs name: a markdown link (``[text](docs/x.md#anchor)``) or a
path in backticks (`` `harness/logs/invariants/` ``). Both are checked against the working tree
(and a link's ``#anchor`` against the headings of the file it points to, as GitHub makes
anchors), so a renamed file or heading breaks this test instead of a reader's first hour.
Paths that are outputs a command writes, not files of the repository, are listed in
``OUTPUT_PATHS`` with the reason.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: backticked paths that name what a command writes (or a user's own file), with why
OUTPUT_PATHS: Dict[str, str] = {
    "runs/default/": "rlharness simulate's default run folder (runs/<scenario name>)",
    "runs/mixed": "the --out folder of the README's simulate example",
    "runs/a": "rlharness diff's example run folders",
    "runs/b": "rlharness diff's example run folders",
    "runs/default/events.jsonl": "the event log rlharness simulate writes",
    "runs/wake-vs-tp": "the --out folder of a sweep example",
    "minimized/": "rlharness fuzz's output folder of minimized reproducers",
    "out/sync.json": "a gate's --report path in an example",
    "out/teardown.json": "a gate's --report path in an example",
    "out/dual.json": "a gate's --report path in an example",
    "out/dataplane.json": "a gate's --report path in an example",
    "out/dataplane_tq.json": "a gate's --report path in an example",
    "out/parity.json": "a gate's --report path in an example",
    "runs/gates/NAME.json": "rlharness gate's default report path (docs/gates.md)",
}

#: upstream repositories' paths (RLix, NeMo RL, ROLL, vLLM, verl, SGLang, Megatron-LM and Megatron-Bridge,
#: nccl-tests, the ML.ENERGY leaderboard) the docs cite as sources, by prefix
UPSTREAM_PREFIXES = (
    "rlix/",
    "nemo_rl/",
    "roll/",
    "vllm/",
    "megatron/core/",
    "src/megatron/",
    "doc/PERFORMANCE.md",
    "tests/test_",
    "tests/unit/algorithms/",
    "tests/unit/data_plane/",
    "tests/unit/single_controller/",
    "tests/unit/models/",
    "tests/integration/",
    "examples/RLIX_EXPERIMENT.md",
    "examples/nemo_rl_test/",
    "plans/",
    "docs/design-docs/",
    "docs/about/",
    "examples/run_grpo",
    "recipe/",
    "verl/",
    "python/sglang/",
    "examples/configs/",
    "public/data/models/",
)

#: test files of upstream repositories (NeMo RL) that the parity docs cite by file name alone
UPSTREAM_TEST_FILES = {
    "test_resiliency_config.py",
    "test_rollout_pump.py",
    "test_sampler_interface.py",
    "test_sc_checkpointing.py",
    "test_single_controller.py",
    "test_tq_replay_buffer.py",
}

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")
_PATHLIKE = re.compile(r"^\.?[A-Za-z0-9_][A-Za-z0-9_.\-]*(?:/[A-Za-z0-9_.\-*]+)*/?$")
_FILE_EXT = (".py", ".md", ".yaml", ".yml", ".jsonl", ".json", ".txt", ".toml", ".ini", ".svg", ".png", ".cfg")
_TOP = ("harness/", "simulators/", "gpu_gates/", "rlharness/", "tests/", "examples/", "docs/", "benchmarks/", ".ci/")


def doc_files() -> List[str]:
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _strip_fences(text: str) -> str:
    """Text outside ``` fences: commands in a code block are examples, not references."""
    return re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def slugs(path: str) -> Set[str]:
    """The anchors GitHub gives a markdown file's headings (lower case, punctuation
    dropped, spaces to hyphens, a repeated heading numbered)."""
    seen: Dict[str, int] = {}
    out: Set[str] = set()
    for line in _strip_fences(open(path, encoding="utf-8").read()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: str) -> Iterator[Tuple[int, str]]:
    text = _strip_fences(open(path, encoding="utf-8").read())
    for m in _LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z]+:", target):
            continue
        yield text.count("\n", 0, m.start()) + 1, target


def code_paths(path: str) -> Iterator[Tuple[int, str]]:
    """Backticked strings that look like a repository path: a known top folder, or a
    relative path with a folder and a file extension."""
    text = _strip_fences(open(path, encoding="utf-8").read())
    for m in _CODE.finditer(text):
        s = m.group(1).strip()
        if " " in s or not _PATHLIKE.match(s) or "/" not in s:
            continue
        if s.startswith(_TOP) or s.endswith(_FILE_EXT) or s.endswith("/"):
            yield text.count("\n", 0, m.start()) + 1, s


def _exists(base: str, rel: str) -> bool:
    """The path exists from the doc's folder, the root or examples/; a ``module.Name``
    ending (``harness/streaming/split_step.SplitStepMachine``) names its module file."""
    head, _, last = rel.rpartition("/")
    candidates = [rel]
    if "." in last and not last.endswith(_FILE_EXT):
        candidates.append(f"{head}/{last.split('.', 1)[0]}.py")
    for start in (base, ROOT, os.path.join(ROOT, "examples")):
        for c in candidates:
            p = os.path.normpath(os.path.join(start, c))
            if ("*" in c and glob.glob(p)) or os.path.exists(p):
                return True
    return False


_TEST_REF = re.compile(r"`((?:[A-Za-z0-9_.\-]+/)*[A-Za-z0-9_.\-]+\.py)?((?:::[A-Za-z_]\w*)*)`")


def cited_tests(path: str) -> Iterator[Tuple[int, str, str]]:
    """``(line, file, name)`` for each backticked `` `file.py::name` `` (or
    ``file.py::Class::name``); a bare `` `::name` `` names a test of the last ``.py`` file
    named before it on the same line."""
    text = _strip_fences(open(path, encoding="utf-8").read())
    for number, line in enumerate(text.splitlines(), 1):
        last = None
        for m in _TEST_REF.finditer(line):
            last = m.group(1) or last
            if last is not None and m.group(2):
                yield number, last, m.group(2).rsplit("::", 1)[1]


def _test_file(base: str, rel: str) -> Optional[str]:
    """The project file a test reference names: a path as ``_exists`` resolves it, or a
    bare file name found once under tests/."""
    if "/" not in rel:
        found = glob.glob(os.path.join(ROOT, "tests", "**", rel), recursive=True)
        return found[0] if len(found) == 1 else None
    for start in (base, ROOT):
        p = os.path.normpath(os.path.join(start, rel))
        if os.path.isfile(p):
            return p
    return None


def broken_test_references(path: str) -> List[str]:
    """A `` `path::test` `` reference whose file is missing or does not define the test."""
    problems: List[str] = []
    name = os.path.relpath(path, ROOT)
    for line, rel, test in cited_tests(path):
        if os.path.basename(rel) in UPSTREAM_TEST_FILES or (
            rel.startswith(UPSTREAM_PREFIXES) and not rel.startswith("tests/")
        ):
            continue
        found = _test_file(os.path.dirname(path), rel)
        if found is None:
            problems.append(f"{name}:{line}: test `{rel}::{test}`: no such test file")
        elif not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{test}\b", open(found, encoding="utf-8").read(), re.M):
            problems.append(f"{name}:{line}: test `{rel}::{test}`: {rel} defines no {test}")
    return problems


def broken_references() -> List[str]:
    problems: List[str] = []
    for path in doc_files():
        name = os.path.relpath(path, ROOT)
        base = os.path.dirname(path)
        for line, target in links(path):
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(base, file_part)) if file_part else path
            if not os.path.exists(dest):
                problems.append(f"{name}:{line}: link to {target!r}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in slugs(dest):
                problems.append(f"{name}:{line}: link to {target!r}: no heading with anchor #{anchor}")
        for line, rel in code_paths(path):
            if rel in OUTPUT_PATHS or (rel.startswith(UPSTREAM_PREFIXES) and not _exists(base, rel)):
                continue
            if not _exists(base, rel):
                problems.append(f"{name}:{line}: path `{rel}`: not in the repository")
        problems += broken_test_references(path)
    return problems


def test_every_link_and_path_the_docs_name_exists():
    problems = broken_references()
    assert not problems, "\n".join(problems)


def tracked_paths(paths: List[str]) -> List[str]:
    """The paths git tracks (a file, or a folder holding one). A command's output on disk
    is not the repository: the README's own first command writes ``runs/default/`` (git
    ignores ``runs/``), and the suite must stay green after it."""
    import subprocess

    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--", *paths], capture_output=True, check=True).stdout
    files = [f for f in out.decode().split("\0") if f]
    return [p for p in paths if any(f == p.rstrip("/") or f.startswith(p.rstrip("/") + "/") for f in files)]


def test_the_output_allow_list_names_only_paths_that_are_not_in_the_repository():
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout: which paths the repository holds is git's answer")
    present = tracked_paths(list(OUTPUT_PATHS))
    assert not present, f"these are files of the repository now; drop them from OUTPUT_PATHS: {present}"


def test_an_output_folder_on_disk_is_not_a_repository_path_but_a_tracked_file_is(tmp_path):
    """The premise of the allow-list test: ``runs/default/`` written by ``rlharness
    simulate`` (git-ignored) is not in the repository; a tracked file is."""
    if not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    assert tracked_paths(["README.md", "docs/", "runs/default/", "no/such/path"]) == ["README.md", "docs/"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("see [x](docs/nowhere.md)", "no such file"),
        ("see [x](MODELLED#no-such-heading)", "no heading with anchor"),
        ("the folder `harness/nowhere/` holds it", "not in the repository"),
        ("see `tests/unit/test_doc_links.py::test_nothing_by_this_name`", "defines no test_nothing_by_this_name"),
        (
            "see `tests/unit/test_doc_links.py::test_slugs_follow_github`, `::test_nothing_by_this_name`",
            "defines no test_nothing_by_this_name",
        ),
        ("see `tests/unit/test_no_such_file.py::test_slugs_follow_github`", "no such test file"),
        ("see `test_no_such_file.py::test_slugs_follow_github`", "no such test file"),
    ],
)
def test_a_broken_reference_is_reported(tmp_path, monkeypatch, text, expected):
    fake = tmp_path / "README.md"
    modelled = os.path.relpath(os.path.join(ROOT, "docs", "modelled-systems.md"), tmp_path)
    fake.write_text(text.replace("MODELLED", modelled) + "\n", encoding="utf-8")
    monkeypatch.setitem(globals(), "doc_files", lambda: [str(fake)])
    problems = broken_references()
    assert len(problems) == 1 and expected in problems[0], problems


def test_slugs_follow_github():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False, encoding="utf-8") as fh:
        fh.write(
            "# RLix: one scheduling cycle\n## `streaming` (in a `single_controller` pipeline)\n## Notes\n## Notes\n"
        )
    try:
        assert slugs(fh.name) == {
            "rlix-one-scheduling-cycle",
            "streaming-in-a-single_controller-pipeline",
            "notes",
            "notes-1",
        }
    finally:
        os.unlink(fh.name)


def test_readme_names_no_issue_numbers_sessions_or_commits():
    """The README is for a new user: no tracker numbers, work-session dates or commit
    hashes they cannot follow."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    found = re.findall(
        r"(?<![\w/&])#\d+\b|\b[Ss]ession \d+\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", text
    )
    assert not found, found

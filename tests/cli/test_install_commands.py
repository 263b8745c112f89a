"""The README's install commands are the ones CI runs, and the CPU torch pin is kept.

``.ci/run`` must run the README's test command verbatim (a README command nobody runs
drifts), and the install must never be able to pull a CUDA torch: the constraints pin the
``+cpu`` build and the command fetches it from the PyTorch CPU index on its own.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def _readme_test_command() -> str:
    block = re.search(r"\*\*Test suite\*\*:\s*```bash\n(.*?)\n```", _read("README.md"), re.S)
    assert block, "README.md lost its **Test suite** command block"
    return block.group(1).strip()


def test_ci_runs_the_readme_test_command_verbatim():
    command = _readme_test_command()
    assert command in _read(".ci", "run").splitlines()


def test_the_test_install_takes_the_cpu_torch_from_the_pytorch_cpu_index():
    command = _readme_test_command()
    first, second = [part for part in command.split(" && ") if part.startswith("pip install")]
    # torch alone first, from the CPU index, under the pin; then everything else
    assert "--no-deps" in first and "--index-url https://download.pytorch.org/whl/cpu" in first
    assert "-c .ci/constraints.txt" in first and first.endswith(" torch")
    assert "-c .ci/constraints.txt" in second and "download.pytorch.org" not in second
    pins = [
        line.strip()
        for line in _read(".ci", "constraints.txt").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    torch_pins = [p for p in pins if p.startswith("torch")]
    assert len(torch_pins) == 1 and re.fullmatch(r"torch==[0-9.]+\+cpu", torch_pins[0]), torch_pins

"""The minimal valid scenario the scenario tests start from and then break one field of
(shared by ``test_scenario.py`` and ``test_scenario_fields.py``)."""

from __future__ import annotations

import yaml

BASE = """\
name: t
cluster: {nodes: 1, gpus_per_node: 8}
pipelines:
  - {name: ppl1, type: nemo_async, train_gpus: [0], infer_gpus: [0, 1]}
  - {name: ppl2, type: nemo_async, train_gpus: [1], infer_gpus: [0, 1]}
"""


def base() -> dict:
    return yaml.safe_load(BASE)

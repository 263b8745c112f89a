"""rlharness size: layouts searched, refused ones named, the cheapest that meets the
target picked; its figure is the one preflight gives for the same layout."""

from __future__ import annotations

import re

from rlharness.cli import main
from tests.unit.test_config_import import CHILD, PARENT


def _config(tmp_path):
    (tmp_path / "parent.yaml").write_text(PARENT)
    (tmp_path / "child.yaml").write_text(CHILD.replace("vllm_cfg: {tensor_parallel_size: 2}", "vllm_cfg: {}"))
    return str(tmp_path / "child.yaml")


def _rows(text):
    return [
        m.groups()
        for m in re.finditer(
            r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d,]+)\s+([\d.]+)\s+(meets|below target)$", text, re.M
        )
    ]


def test_the_cheapest_layout_that_meets_the_target(tmp_path, capsys):
    config = _config(tmp_path)
    assert (
        main(["size", config, "--target-tokens-per-s", "1", "--max-nodes", "2", "--plot", str(tmp_path / "p.png")]) == 0
    )
    out = capsys.readouterr().out
    rows = _rows(out)
    assert len(rows) >= 4 and (tmp_path / "p.png").stat().st_size > 1000
    meets = sorted((int(g), float(h), n, tp, tok) for n, g, tp, _, tok, h, v in rows if v == "meets")
    gpus, hours, nodes, tp, tokens = meets[0]
    assert f"cheapest: {nodes} node(s), {gpus} GPUs, generation TP {tp}: {tokens} tokens/s" in out
    # the same layout through preflight gives the same tokens/s
    assert (
        main(
            [
                "preflight",
                config,
                "--set",
                f"++cluster.num_nodes={nodes}",
                "--set",
                f"policy.generation.vllm_cfg.tensor_parallel_size={tp}",
            ]
        )
        == 0
    )
    assert f"{tokens} generated tokens/s" in capsys.readouterr().out


def test_no_layout_reaches_an_impossible_target_and_bad_input(tmp_path, capsys):
    config = _config(tmp_path)
    assert main(["size", config, "--target-tokens-per-s", "1e12", "--max-nodes", "1"]) == 1
    assert "none of these layouts reaches the target" in capsys.readouterr().out
    assert main(["size", config, "--target-tokens-per-s", "-3"]) == 2
    assert main(["size", str(tmp_path / "missing.yaml"), "--target-tokens-per-s", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "--target-tokens-per-s" in err and "no such file" in err

"""Draw docs/img/architecture.svg: the layers, the three runtimes and the event log.

Run ``python docs/img/architecture.py`` after changing the layout; the SVG keeps its text
as text (small, searchable) and carries no date, so a redraw of the same picture gives the
same bytes.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "architecture.svg")


def box(ax, x, y, w, h, title, body, colour):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=colour, ec="#333333", lw=1.0))
    ax.text(x + w / 2, y + h - 0.17, title, ha="center", va="top", fontsize=10.5, weight="bold")
    ax.text(x + w / 2, y + h - 0.5, body, ha="center", va="top", fontsize=8.3, linespacing=1.35)


def arrow(ax, a, b, text="", dx=0.0):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, lw=1.0, color="#333333"))
    if text:
        ax.text((a[0] + b[0]) / 2 + dx, (a[1] + b[1]) / 2, text, ha="left", va="center", fontsize=7.8, style="italic")


def main() -> None:
    plt.rcParams["svg.fonttype"] = "none"
    plt.rcParams["svg.hashsalt"] = "rlharness"
    fig, ax = plt.subplots(figsize=(10, 6.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6.6)
    ax.axis("off")
    box(ax, 0.2, 5.0, 9.6, 1.4, "rlharness/  (entry points: may import every layer)",
        "rlharness CLI: simulate, validate, replay, check, export, fuzz, import, sweep, diff, gate\n"
        "pytest plugin: rlharness_run, rlharness_scenario fixtures; gpu and gate markers", "#e8eef7")
    box(ax, 0.2, 2.7, 3.0, 1.9, "simulators/  (simpy)",
        "modelled time, VRAM and host-RAM\nledgers, links, router, refit costs,\n"
        "scenarios and their validation,\nfaults, fuzz", "#eaf5e6")
    box(ax, 3.5, 2.7, 3.0, 1.9, "gpu_gates/  (torchrun)",
        "real process groups and tensors,\nNCCL or gloo, CUDA IPC,\nwatchdogs, JSON reports", "#fbefe0")
    box(ax, 6.8, 2.7, 3.0, 1.9, "replay  (harness/replay.py)",
        "a recorded trace's inputs fed to\nthe scheduler model; decisions\ncompared with --expect;\n"
        "RLix log importer", "#f3e8f5")
    box(ax, 0.2, 0.2, 9.6, 2.1, "harness/  (no clock, no I/O: written once, used by every runtime)",
        "scheduler model (RLix's decisions)   control logic (generators that yield effects)   topology\n"
        "streaming controller   data plane   refit stream protocol and bucket cache\n"
        "event log: kinds, schema, writer   invariant oracle (named checks over any log)   outputs: summary, trace, timeline",
        "#f5f5f5")
    for x in (1.7, 5.0, 8.3):
        arrow(ax, (x, 5.0), (x, 4.6))
        arrow(ax, (x, 2.7), (x, 2.3))
    ax.text(1.75, 2.5, "interprets effects", fontsize=7.8, style="italic")
    ax.text(5.05, 2.5, "interprets effects", fontsize=7.8, style="italic")
    ax.text(8.35, 2.5, "feeds inputs", fontsize=7.8, style="italic")
    ax.text(5.0, 4.78, "every runtime writes the same JSONL event log; one oracle checks it",
            ha="center", fontsize=8.3, weight="bold", color="#7a3b00")
    fig.savefig(OUT, format="svg", bbox_inches="tight", metadata={"Date": None})


if __name__ == "__main__":
    main()

"""Record kinds written by the GPU gates (gpu_gates/). Replay passes over them."""

GATE_KINDS: dict = {}

"""GPU gates: torchrun entry points that run the harness's refit and teardown paths on real
devices (NCCL) and, for CI, on CPU with gloo. See docs/gates.md."""

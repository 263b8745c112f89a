"""The NCCL teardown gate's parts: model-parallel group builders and their teardowns."""

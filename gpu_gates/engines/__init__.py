"""Inference engines the gates drive: a tiny engine with vLLM's sleep-mode memory, and the
methods the vLLM gate adds to vLLM's worker."""

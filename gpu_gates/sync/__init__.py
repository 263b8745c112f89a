"""The selective weight sync on real tensors: the CPU bucket cache, the same-GPU transport, the
gates' handlers for the harness's sync effects."""

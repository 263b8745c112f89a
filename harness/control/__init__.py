"""Pipeline control logic, written once as effect-yielding generators (sans-IO).

``resize.expand_order`` / ``resize.shrink_order`` define the resize orders;
``nemo_async`` and ``roll_sync`` define the per-step sequences. The simulator and the
GPU gates interpret the same generators with the one interpreter, ``interpret`` (see
``effects`` for the vocabulary).
"""

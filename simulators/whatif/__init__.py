"""What-if runs: a grid of ``--set`` values x seeds, each run checked by the oracle, and
one comparison table (``rlharness sweep``)."""

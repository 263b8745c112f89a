"""``python -m rlharness``: the ``rlharness`` command without its installed script."""

from rlharness.cli import run

raise SystemExit(run())

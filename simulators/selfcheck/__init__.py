"""The simulator checking itself: determinism in a fresh process, and across CPython versions."""

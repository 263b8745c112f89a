"""Importers: logs of real systems turned into replayable rlharness input traces."""

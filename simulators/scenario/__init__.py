"""Scenario files: the data model, the YAML dialect, field rules, cross-field checks,
feasibility, limits, ``--set`` overrides, the dump and the generated reference."""

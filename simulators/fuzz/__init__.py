"""`rlharness fuzz`: generated scenarios and fault mixes, each run checked by the oracle; findings
grouped by signature, minimized, and judged against a baseline."""

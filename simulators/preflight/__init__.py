"""``rlharness preflight``: one verdict per question (fits, cannot deadlock, staleness, step
time, known upstream behaviours), from the static memory plan and a short simulation."""

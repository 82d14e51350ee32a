"""``scripts/bench household`` (main.py): a seeded trace (trace.py) of the captured
household's requests replayed against each configuration's server (replay.py), then
summarized and checked against the goals (report.py)."""

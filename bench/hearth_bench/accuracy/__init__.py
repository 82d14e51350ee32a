"""``scripts/bench accuracy`` (main.py): sentences from a dataset (data.py) run through the
whole product against homes set up from their fixtures (home.py, setup.py), judged by
the states they leave (judge.py, harm.py) and the tool calls sent (calls.py), then
reported (report.py)."""

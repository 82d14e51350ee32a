"""``scripts/bench fuzz`` (main.py): seeded bad and good requests (base.py, hostile.py)
against a real engine server."""

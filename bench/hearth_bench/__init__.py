"""Hearth benchmarks: measurements printed side by side in one run (not tests)."""

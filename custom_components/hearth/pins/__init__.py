"""The pins' lifecycle in the engine: when to (re)pin, and what is kept of each."""

"""What the house has, and what it calls its things, areas and floors.

- ``names.py``: the house's names, and what a call must carry to name one thing;
- ``values.py``: those names as argument values for the engine's grammar;
- ``kinds.py``: the only thing of its kind named by its kind ("the vacuum");
- ``listing.py``: the house as the pinned prompt lists it; ``diff.py``: what changed since,
  told as sentences;
- ``device_class.py``: what the speaking device changes in HA's prompt and tools.
"""

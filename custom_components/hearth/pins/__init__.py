"""The pins' lifecycle in the engine: when to (re)pin, and what is kept of each.

- ``manager.py``: ``PrefixManager``, which composes the parts below;
- ``agents.py``: the entry's pins, one per agent and device class;
- ``events.py``: the house changes that re-pin, and the debounce;
- ``renders.py`` and ``choice.py``: what each pin renders, and the prefix each request
  starts with;
- ``pinning.py``: the PUT, refits, retries and folds;
- ``rebuilds.py`` and ``repairs.py``: rebuilds counted by cause, and the Repairs issues;
- ``model.py`` and ``history.py``: what is kept of each pin, across restarts too.
"""

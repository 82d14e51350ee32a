"""The stable house prefix of an agent: rendered, sized, and told as changes.

- ``value.py``: the prefix as a value (no Home Assistant, no hassil: the backends read it);
- ``render.py``: what every request starts with, byte for byte; ``examples.py``: its
  worked examples;
- ``budget.py``: how much of the model's context the house may take;
- ``delta.py``: a re-pin that costs what changed.
"""

"""Hearth's inference engine.

Importing the package caps torch to the ``HEARTH_CPU`` class (``cpu_class.py``): torch
reads its caps once, at its first operator, and every way into the engine (``python -m
hearth_engine``, the ``hearth-engine`` script, the benchmarks, the tests) imports this
package before it touches torch.
"""

from .cpu_class import apply_environment

apply_environment()

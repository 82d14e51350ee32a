"""Errors the model layer raises at load, shared by the loader and the model builders."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model cannot be used. The message is one line and names the path."""

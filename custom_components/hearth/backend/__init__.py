"""The server behind an engine entry, Hearth's engine or any OpenAI-compatible one.

- ``base.py``: the ``Backend`` interface; ``hearth.py`` and ``openai_compat.py`` are the two
  kinds, and ``kinds.py`` probes a server (``server_info.py``) and picks one;
- ``api.py``: Hearth's pin API and probe routes; ``chat.py``: chat completions through the
  ``openai`` SDK;
- ``coordinator.py``: the polls; ``server_stats.py``: another server's figures;
  ``priming.py``: warming another server's prompt cache.
"""

"""Grammar-constrained decoding (llguidance): tool calls and JSON replies that are valid.

* ``grammar``: a request's tools, ``tool_choice``, ``response_format`` and house values
  as a Lark grammar (text; no library needed);
* ``compiler``: grammars compiled once per tool set (a bounded LRU), and per-request
  matchers started from them (the server's prepare thread);
* ``mask``: per-request ``Constraint`` and the engine's ``Masker``, which fills the
  token bitmask of the constrained rows and applies it to a batch's logits in one step.
"""

"""One turn, read top to bottom: understand the request, decide, call, speak.

- ``prepare.py``: the turn as one pipeline, ``async_prepare_turn``;
- ``understand.py``: the request read once (its words, what it names, whether it asks,
  its nearest example from ``hints.py``; ``parts.py``: the commands of a request that
  says several, each then a turn of its own);
- ``decide.py``: the pure policy, what each request of the turn carries;
- ``plan.py`` and ``prompt.py``: what a request sends (the prefix, tools, context, the
  messages);
- ``run.py``: the turn's requests, one loop (``context_fit.py``: one over the model's
  context is sent again with less); ``stream.py``: each streamed reply as chat-log deltas
  (``speech.py``, ``speech_stream.py``: what may be spoken, and when);
- ``call.py``: whether each call runs, and with what arguments (``guard.py``: never an
  action the request did not ask for; ``reading.py``: what the request reads as in Home
  Assistant's intents data);
- ``speak.py``: what the turn says of its calls (``result_speech.py``: what Home Assistant
  reported done).
"""

"""Home Assistant's own language data, read for each request.

- ``intents_data.py``: ``home-assistant-intents`` per language, loaded off the event loop;
- ``words.py``: the words the intents say, and which intent a request says most of;
- ``sentences.py``: the intents' sentences said of this house (hassil), and HA's answers;
- ``questions.py``: whether a request asks.
"""

"""One turn: understand the request, decide, call Home Assistant's tools, speak."""

"""Home Assistant's own language data, read for each request."""

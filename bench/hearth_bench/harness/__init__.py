"""What the benchmarks and the end-to-end tests start and watch: an engine process
(server.py, process.py), a real Home Assistant on the demo house beside it (stack.py), a
recording proxy between them (proxy.py), and the household fixture captured through them
(capture.py, fixture.py)."""

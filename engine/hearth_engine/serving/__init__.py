"""The engine loop: requests, scheduling, batching, sampling, pins, output."""

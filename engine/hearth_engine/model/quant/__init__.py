"""Weights that stay 4- or 8-bit: GGUF blocks as tiles (``ggml_blocks``, ``tiles``), the
linears and embedding that read them (``linear``), and a packed GGUF folder (``folder``)."""

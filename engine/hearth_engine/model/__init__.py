"""The model: loading, the lean decoder and its kernels, KV buffers, the compiled step."""

"""``scripts/bench quant`` (main.py): Hearth and llama-server on the same GGUF files
(files.py makes them), beside the kernels alone (kernels.py) and the formats' quality
against bf16 (quality.py)."""

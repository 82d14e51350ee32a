"""Per-token framework overhead: a decode step whose kernels cost next to nothing.

The model under test is rebuilt with its own layer count, head counts and forward
pass, but 16-wide heads, a 64-wide MLP and a 256-token vocabulary (random weights). Its
decode step then does every Python call and every operator dispatch the real step does,
while its matrix products and attention read a few kilobytes. Its time is therefore the
step's overhead: the gap between a real step and the kernels it runs. The target is at
most 5 ms (issue 12).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from hearth_engine.model import attention
from hearth_engine.model.attention import PrefixPart
from hearth_engine.model.linear import Quantization
from hearth_engine.model.loader import LoadedModel
from hearth_engine.model.runner import Forward, ModelRunner

HEAD_DIM = 16  # the smallest head the native decode attention takes
VOCAB = 256


def skeleton(runner: ModelRunner) -> ModelRunner:
    """``runner``'s model with the same layers and forward, and near-free kernels."""
    config = copy.deepcopy(runner.model.config)
    text = config.get_text_config(decoder=True)
    text.hidden_size = text.num_attention_heads * HEAD_DIM
    text.head_dim = HEAD_DIM
    text.intermediate_size = 64
    text.vocab_size = VOCAB
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention.register())
    model = model.eval().to(runner.layout.dtype).to(runner.layout.device)
    loaded = LoadedModel(
        path=runner.loaded.path,
        name=f"{runner.info.name}-skeleton",
        model=model,
        tokenizer=runner.tokenizer,
        fingerprint="skeleton",
        context_length=runner.info.context_length,
    )
    forward = Forward.LEAN if runner.lean is not None else Forward.TRANSFORMERS
    return ModelRunner(
        loaded,
        runner.layout.device,
        runner.layout.dtype,
        Quantization(runner.info.quantization),
        forward,
    )


def overhead_ms(runner: ModelRunner, context: int = 512, steps: int = 32) -> float:
    """Median ms of a one-row decode step of ``runner``'s skeleton reading a shared
    ``context``-token prefix in place, as a request on a pinned house does."""
    bare = skeleton(runner)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, VOCAB, (context + 1,), generator=gen).tolist()
    source = bare.new_buffer(1, context)
    bare.prefill(source, tokens[:context])
    part = PrefixPart(source.read_segment(0, 0, context))
    own = bare.new_buffer(1, steps + 4)
    bare.prefill(own, tokens[context:], [part.segment])
    times = []
    for i in range(steps + 2):
        started = time.perf_counter()
        bare.decode(own, [tokens[i % context]], [context + 1 + i], None, [part])
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[2:])

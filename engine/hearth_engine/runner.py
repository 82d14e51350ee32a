"""The model runner: forward passes over ``KVBuffer`` working caches.

The hot path is a few small functions (in the spirit of gpt-fast): ``prefill`` runs one
chunk of one sequence, ``decode`` runs one token for every row of a batch. Everything
else (which tokens, which cache, which rows) is decided by the engine.
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from .hardware import pick_device, pick_dtype
from .kv import KVBuffer, KVLayout
from .loader import LoadedModel, load_model

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """What the rest of the engine needs to know about the loaded model."""

    name: str
    path: str
    fingerprint: str
    device: str
    dtype: str
    context_length: int
    bytes_per_token: int
    vocab_size: int

    @property
    def namespace(self) -> str:
        """Cache namespace: different models or dtypes never share KV."""
        return f"{self.fingerprint}:{self.dtype}"


class ModelRunner:
    """Owns the model; all its methods run on the engine's worker thread."""

    def __init__(self, loaded: LoadedModel, device: torch.device, dtype: torch.dtype) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        text_config = self.model.config.get_text_config(decoder=True)
        heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        self.layout = KVLayout(
            layers=text_config.num_hidden_layers,
            kv_heads=getattr(text_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.info = ModelInfo(
            name=loaded.name,
            path=str(loaded.path),
            fingerprint=loaded.fingerprint,
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            context_length=loaded.context_length,
            bytes_per_token=self.layout.bytes_per_token,
            vocab_size=int(text_config.vocab_size),
        )

    @classmethod
    def load(cls, spec: str, device: str = "auto", dtype: str = "auto") -> ModelRunner:
        dev = pick_device(device)
        dt = pick_dtype(dev, dtype)
        started = time.monotonic()
        loaded = load_model(spec, dev, dt)
        _LOGGER.info(
            "Loaded %s on %s as %s in %.1f s", loaded.name, dev, dt, time.monotonic() - started
        )
        return cls(loaded, dev, dt)

    def new_buffer(self, rows: int, capacity: int, length: int = 0) -> KVBuffer:
        return KVBuffer(self.layout, rows, capacity, length)

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_kwarg: cache}
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=attention_mask,
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
        return out.logits[:, -1, :].float()  # [B, V]

    def prefill(self, cache: KVBuffer, token_ids: list[int]) -> torch.Tensor:
        """Append ``token_ids`` to the single-row ``cache``; logits of the last one: [V]."""
        device = self.layout.device
        start = cache.length
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)  # [1, S]
        positions = torch.arange(start, start + len(token_ids), device=device)[None, :]
        return self._forward(ids, positions, cache, None)[0]

    def decode(
        self,
        cache: KVBuffer,
        token_ids: list[int],
        positions: list[int],
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """One token per row of a (left-padded) batch cache. Returns logits [B, V]."""
        device = self.layout.device
        ids = torch.tensor(token_ids, dtype=torch.long, device=device)[:, None]  # [B, 1]
        pos = torch.tensor(positions, dtype=torch.long, device=device)[:, None]  # [B, 1]
        return self._forward(ids, pos, cache, attention_mask)


def load_runner(spec: str, device: str = "auto", dtype: str = "auto") -> ModelRunner:
    return ModelRunner.load(spec, device, dtype)

"""The model runner: forward passes over ``KVBuffer`` working caches.

The hot path is a few small functions (in the spirit of gpt-fast): ``prefill`` runs one
chunk of one sequence, ``decode`` runs one token for every row of a batch. Everything
else (which tokens, which cache, which rows) is decided by the engine.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .attention import PrefixPart, shared_prefix
from .hardware import pick_device, pick_dtype
from .kv import KVBuffer, KVLayout, segment_tokens
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

    @functools.cached_property
    def shares_prefix(self) -> bool:
        """Whether attention can read cached prefixes in place (self-test, run once)."""
        return self.check_shared_prefix()

    def new_buffer(self, rows: int, capacity: int, length: int = 0) -> KVBuffer:
        return KVBuffer(self.layout, rows, capacity, length)

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,
        parts: Sequence[PrefixPart] = (),
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_kwarg: cache}
        with torch.inference_mode(), shared_prefix(parts):
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=attention_mask,
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
        return out.logits[:, -1, :].float()  # [B, V]

    def prefill(
        self, cache: KVBuffer, token_ids: list[int], shared: Sequence[torch.Tensor] = ()
    ) -> torch.Tensor:
        """Append ``token_ids`` to the single-row ``cache``; logits of the last one: [V].

        ``shared`` are cached segments ``[L, 2, H, T, D]`` that precede the cache's own
        tokens and are read in place (see ``attention``).
        """
        device = self.layout.device
        start = sum(segment_tokens(s) for s in shared) + cache.length
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)  # [1, S]
        positions = torch.arange(start, start + len(token_ids), device=device)[None, :]
        parts = [PrefixPart(s) for s in shared]
        return self._forward(ids, positions, cache, None, parts)[0]

    def decode(
        self,
        cache: KVBuffer,
        token_ids: list[int],
        positions: list[int],
        attention_mask: torch.Tensor | None,
        parts: Sequence[PrefixPart] = (),
    ) -> torch.Tensor:
        """One token per row of a (left-padded) batch cache. Returns logits [B, V].

        ``positions`` are absolute (shared prefix tokens included); ``parts`` are the
        shared prefixes the rows read in place.
        """
        device = self.layout.device
        ids = torch.tensor(token_ids, dtype=torch.long, device=device)[:, None]  # [B, 1]
        pos = torch.tensor(positions, dtype=torch.long, device=device)[:, None]  # [B, 1]
        return self._forward(ids, pos, cache, attention_mask, parts)

    def check_shared_prefix(self, tokens: int = 24) -> bool:
        """Whether reading a prefix in place gives the logits of copying it (self-test).

        Run once at engine start: a model whose attention Hearth cannot merge (or any
        numerical surprise) makes the engine copy prefixes instead, never answer wrong.
        """
        gen = torch.Generator().manual_seed(0)
        vocab = max(2, min(self.info.vocab_size, 1000))
        ids = torch.randint(1, vocab, (tokens,), generator=gen).tolist()
        half = tokens // 2
        try:
            full = self.new_buffer(1, tokens + 1)
            expected = self.prefill(full, ids)
            own = self.new_buffer(1, tokens + 1)
            got = self.prefill(own, ids[half:], [full.read_segment(0, 0, half)])
            own_step = self.decode(
                own, [ids[0]], [tokens], None, [PrefixPart(full.data[:, :, 0, :, :half])]
            )
            full_step = self.decode(full, [ids[0]], [tokens], None)
        except Exception as err:  # noqa: BLE001 - any failure means: copy, as before
            _LOGGER.warning("Shared-prefix attention unavailable (%s): prefixes are copied", err)
            return False
        tol = 1e-2 if self.layout.dtype in {torch.float16, torch.bfloat16} else 1e-4
        scale = float(expected.abs().max()) + 1.0
        ok = bool(
            torch.allclose(got, expected, atol=tol * scale, rtol=0)
            and torch.allclose(own_step, full_step, atol=tol * scale, rtol=0)
        )
        if not ok:
            _LOGGER.warning("Shared-prefix attention disagrees with the model: prefixes are copied")
        return ok


def load_runner(spec: str, device: str = "auto", dtype: str = "auto") -> ModelRunner:
    return ModelRunner.load(spec, device, dtype)

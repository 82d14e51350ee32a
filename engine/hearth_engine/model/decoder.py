"""A lean forward pass for Llama-family decoders (Llama, SmolLM2, Qwen2/2.5, Qwen3).

transformers' forward is general: per layer it checks options, builds masks, routes
keywords and hooks, and each projection is its own kernel call. On a CPU the decode
step of a small model is made of thousands of such small calls, so their overhead is
a large share of the step (SmolLM2-135M, bfloat16, 512 tokens: ~14 of ~38 ms). This
module runs the same arithmetic with the model's own weights and embeddings:

* q/k/v and gate/up are fused into one matrix each (one kernel call, same results);
* weights are prepared once for the fastest kernel here (``linear.FrozenLinear``:
  oneDNN-packed bfloat16, or int8 with ``--quantize int8``);
* RoPE is applied to q and k together; the RMS norms are one fused op each;
* attention is Hearth's (``attention.py``): grouped heads inside the kernel, shared
  prefixes read in place.

A one-token step runs its layers in one native call where it can (``native_step.py``:
the same kernels and operations in the same order, so the same bits). The step is split
for ``compiled.py``: ``step_graph`` is the dense arithmetic, free of
Python that depends on the cache, around one ``attend`` call per layer (the KV write
and Hearth's attention); compiled, ``attend`` is an opaque op.

Anything it does not know (another architecture, a rope it cannot take from the
model, biases on the MLP, a non-SiLU activation) keeps transformers' forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import attention, native, native_step
from .attention import PrefixPart
from .kv import KVBuffer
from .layer_types import sliding_layers
from .linear import QUANT_ATTR, FrozenLinear, Quantization, fuse, tiles_fit
from .quant.linear import QuantLinear, quantize_int8_groups

_LOGGER = logging.getLogger(__name__)

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The lean forward cannot run this model (the message says why, in one line)."""


def unsupported_reason(model: Any) -> str | None:
    """Why the lean forward cannot run ``model``, or ``None`` when it can."""
    config = model.config.get_text_config(decoder=True)
    kind = getattr(config, "model_type", "?")
    if kind not in SUPPORTED_TYPES:
        return f"architecture {kind!r} (the lean forward knows {', '.join(SUPPORTED_TYPES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    if sliding_layers(model.config)[0]:
        return "sliding-window layers"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "layers"):
        return "an unexpected module layout"
    return None


Linear = FrozenLinear | QuantLinear


@dataclass
class _Layer:
    in_norm: torch.Tensor
    in_eps: float
    qkv: Linear
    q_norm: tuple[torch.Tensor, float] | None
    k_norm: tuple[torch.Tensor, float] | None
    o: Linear
    post_norm: torch.Tensor
    post_eps: float
    gate_up: Linear
    down: Linear


def _layer_linears(model: Any) -> list[torch.nn.Linear]:
    """Every decoder layer's projections."""
    linears = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
        linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return linears


def _release_linears(model: Any) -> None:
    """Drop transformers' copies of the weights the lean forward now holds its own way.

    Fused, packed or int8 weights are new tensors; keeping the originals too would
    double the model's memory (``fuse`` takes a quantized file's packed matrices off their
    modules for the same reason). Afterwards only the lean forward can run the model.
    The embedding stays; where the output layer shares it, it is read from the head's
    tiles instead (``_embed_from_head``).
    """
    embed = model.model.embed_tokens.weight
    head = [model.lm_head] if model.lm_head.weight is not embed else []
    for linear in head + _layer_linears(model):
        empty = torch.empty(0, dtype=linear.weight.dtype, device=linear.weight.device)
        linear.weight = torch.nn.Parameter(empty, requires_grad=False)


def _head(head: torch.nn.Linear, quantization: Quantization, tiled: bool) -> Any:
    """The output layer: under ``--quantize int4`` it is int8 per group of 32 (as llama.cpp
    keeps the head wider than the layers); a quantized file's head stays as the file has
    it."""
    if quantization == Quantization.INT4 and getattr(head, QUANT_ATTR, None) is None:
        return QuantLinear([quantize_int8_groups(head.weight.detach())], head.bias)
    # Its calls are decode-sized (a prefill asks for its last token only): with tiles, a
    # packed copy would only serve batches of over TILED_MAX_ROWS rows.
    return fuse([head], quantization, tiled, pack=not tiled)


def _norm_of(module: torch.nn.Module) -> tuple[torch.Tensor, float]:
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", 1e-6)
    return module.weight.detach(), float(eps)


_FUSED_DTYPES = (torch.bfloat16, torch.float32)  # what layer_ops.cpp takes


def _fused(x: torch.Tensor) -> Any:
    """The native kernels when they can take ``x``'s operation in one call, else ``None``.

    Not while torch.compile traces the step (``compiled.py``: inductor fuses these
    itself, and an opaque call would break its graph)."""
    if torch.compiler.is_compiling() or x.dtype not in _FUSED_DTYPES or x.device.type != "cpu":
        return None
    return native.module()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm: normalise in float32, round, then scale."""
    kernels = _fused(x)
    if kernels is not None and x.is_contiguous():
        try:
            return kernels.rms_norm(x, weight, eps)
        except RuntimeError as err:  # a call the kernel refuses: torch's from now on
            native.disable(str(err).splitlines()[0])
    normed = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` ``[B, Q, H, D]``; ``cos``/``sin``
    ``[B, Q, 1, D]``."""
    kernels = _fused(x)
    if kernels is not None:
        try:
            return kernels.rope(x, cos, sin)
        except RuntimeError as err:  # a call the kernel refuses: torch's from now on
            native.disable(str(err).splitlines()[0])
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _chunk_mask(
    q_len: int, past: int, parts: Sequence[PrefixPart], device: torch.device
) -> torch.Tensor | None:
    """The causal mask ``[1, 1, Q, past + Q]`` of a chunk after ``past`` tokens of its own
    KV, aligned bottom-right (SDPA's own causal flag aligns top-left); ``None`` where
    none is needed (one token, no past) or where merged_attention builds it (parts)."""
    if q_len <= 1 or not past or parts:
        return None
    rows = torch.arange(q_len, device=device)[:, None]
    cols = torch.arange(past + q_len, device=device)[None, :]
    return (cols <= rows + past)[None, None]


class _EmbeddingFromHead:
    """The embedding lookup of a tied model, from its output layer's decode tiles."""

    def __init__(self, head: FrozenLinear) -> None:
        self.head = head

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.rows(ids)  # [*ids, hidden]


class LeanDecoder:
    """The forward pass of a supported model; built once, then called per step."""

    def __init__(
        self,
        model: Any,
        quantization: Quantization = Quantization.NONE,
        share_embedding: bool = True,
    ) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise UnsupportedModelError(reason)
        config = model.config.get_text_config(decoder=True)
        inner = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.scale = self.head_dim**-0.5
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm, self.norm_eps = _norm_of(inner.norm)
        weights = [m.weight for m in (model.lm_head, *_layer_linears(model))]
        packed = quantization in (Quantization.INT4, Quantization.GGUF)
        tiled = not packed and tiles_fit(weights, model.lm_head.weight.device)
        self.lm_head = _head(model.lm_head, quantization, tiled)
        self.layers = [self._layer(layer, quantization, tiled) for layer in inner.layers]
        self.quantization = quantization
        self._native: Any = None  # native_step's DecodeLayers once built; False: never
        tied = model.lm_head.weight is inner.embed_tokens.weight
        _release_linears(model)
        if share_embedding and tied:
            self._embed_from_head(model)
        kinds = sorted({x.kind for layer in self.layers for x in (layer.qkv, layer.gate_up)})
        _LOGGER.info(
            "Lean forward: %d layers, %s linears%s",
            len(self.layers),
            "/".join(kinds),
            ", decode tiles" if tiled else "",
        )

    def _embed_from_head(self, model: Any) -> None:
        """A model whose output layer is its embedding keeps that matrix once: as the
        head's decode tiles, which the embedding lookup reads too (54 MiB of the default
        model). Not under torch.compile (``share_embedding=False``): its traced head
        would widen the tiles at every step."""
        head = self.lm_head
        if not isinstance(head, FrozenLinear) or not head.drop_weight():
            return
        self.embed = _EmbeddingFromHead(head)
        empty = torch.empty(0, dtype=model.lm_head.weight.dtype, device=head.tiles.device)
        model.model.embed_tokens.weight = torch.nn.Parameter(empty, requires_grad=False)
        model.lm_head.weight = model.model.embed_tokens.weight

    @staticmethod
    def _layer(layer: Any, quantization: Quantization, tiled: bool) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm = _norm_of(attn.q_norm) if hasattr(attn, "q_norm") else None
        k_norm = _norm_of(attn.k_norm) if hasattr(attn, "k_norm") else None
        in_norm, in_eps = _norm_of(layer.input_layernorm)
        post_norm, post_eps = _norm_of(layer.post_attention_layernorm)
        return _Layer(
            in_norm=in_norm,
            in_eps=in_eps,
            qkv=fuse([attn.q_proj, attn.k_proj, attn.v_proj], quantization, tiled),
            q_norm=q_norm,
            k_norm=k_norm,
            o=fuse([attn.o_proj], quantization, tiled),
            post_norm=post_norm,
            post_eps=post_eps,
            gate_up=fuse([mlp.gate_proj, mlp.up_proj], quantization, tiled),
            down=fuse([mlp.down_proj], quantization, tiled),
        )

    def linear_forms(self) -> dict[str, dict[str, int]]:
        """How each kind of linear is stored: ``{"qkv": {"int4-g32": 28}, ...}``."""
        forms: dict[str, dict[str, int]] = {}
        named = [("lm_head", self.lm_head)]
        for x in self.layers:
            named += [("qkv", x.qkv), ("o", x.o), ("gate_up", x.gate_up), ("down", x.down)]
        for role, linear in named:
            counts = forms.setdefault(role, {})
            counts[linear.kind] = counts.get(linear.kind, 0) + 1
        packed = getattr(self.embed, "qweight", None)
        forms["embed"] = {packed.kind if packed is not None else "float": 1}
        return forms

    def linears(self) -> list[Linear]:
        """Every linear of the forward pass."""
        per_layer = [[x.qkv, x.o, x.gate_up, x.down] for x in self.layers]
        return [self.lm_head, *(linear for group in per_layer for linear in group)]

    def forward(
        self,
        ids: torch.Tensor,  # [B, Q]
        positions: torch.Tensor,  # [B, Q]
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,  # [B, K] bool (decode of a padded batch)
        parts: Sequence[PrefixPart] = (),
    ) -> torch.Tensor:
        """Logits of each row's last position, float32 ``[B, V]``."""
        q_len = ids.shape[1]
        if q_len == 1:
            logits = self._native_forward(ids, positions, cache, attention_mask, parts)
            if logits is not None:
                return logits
        if attention_mask is not None and q_len != 1:
            raise ValueError("a padding mask is only supported for one-token steps")
        if attention_mask is not None:
            mask = attention_mask[:, None, None, :]
        else:
            mask = _chunk_mask(q_len, cache.length, parts, ids.device)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: int) -> torch.Tensor:
            return self.attend(q, k, v, index, cache, mask, parts)

        return self.step_graph(ids, positions, attend)

    def _native_forward(
        self,
        ids: torch.Tensor,  # [B, 1]
        positions: torch.Tensor,  # [B, 1]
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,  # [B, K] bool
        parts: Sequence[PrefixPart],
    ) -> torch.Tensor | None:
        """A one-token step with the layers in one native call (``native_step``), or
        ``None`` where it cannot run (the caller runs the Python loop)."""
        if self._native is False or native.module() is None:
            return None
        if not native_step.takes(self.norm.dtype, ids, cache, attention_mask, parts):
            return None
        if self._native is None:
            self._native = native_step.build(self) or False
            if self._native is False:
                return None
        hidden = self.embed(ids)
        cos, sin = self.rotary(hidden, positions)
        try:
            hidden = native_step.run(
                self._native, hidden, cos[:, :, None], sin[:, :, None], cache, attention_mask, parts
            )
        except RuntimeError as err:  # refused: the Python loop from now on (it rewrites
            self._native = False  # the same KV column, so nothing is lost)
            _LOGGER.warning("Native decode layers off: %s", str(err).splitlines()[0])
            return None
        return self._last_logits(hidden)

    def _last_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each row's logits at its last position, float32 ``[B, V]``."""
        last = rms_norm(hidden[:, -1:], self.norm, self.norm_eps)
        return self.lm_head(last)[:, 0].float()

    def forward_mixed(  # noqa: PLR0917 - two steps' inputs
        self,
        ids: torch.Tensor,  # [B] one token per decode row
        positions: torch.Tensor,  # [B]
        cache: KVBuffer,
        attention_mask: torch.Tensor | None,  # [B, K] bool
        parts: Sequence[PrefixPart],
        chunk_ids: torch.Tensor,  # [S] a prefill chunk of one sequence
        chunk_positions: torch.Tensor,  # [S]
        chunk_cache: KVBuffer,
        chunk_parts: Sequence[PrefixPart],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step and a prefill chunk in one forward: the weights are read once for
        both. Returns the decode rows' logits ``[B, V]`` and the chunk's last ``[V]``.

        The dense parts run over the ``B + S`` tokens as one row; each layer's attention
        splits them again, the decode rows against their cache and the chunk against its
        own (as ``forward`` would run each).
        """
        b, s = ids.shape[0], chunk_ids.shape[0]
        mask = None if attention_mask is None else attention_mask[:, None, None, :]
        chunk_mask = _chunk_mask(s, chunk_cache.length, chunk_parts, ids.device)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: int) -> torch.Tensor:
            rows = [x[0, :b, None] for x in (q, k, v)]  # [B, 1, H, D] each
            chunk = [x[:, b:] for x in (q, k, v)]  # [1, S, H, D] each
            out = self.attend(*rows, index, cache, mask, parts)
            chunk_out = self.attend(*chunk, index, chunk_cache, chunk_mask, chunk_parts)
            return torch.cat([out.reshape(1, b, *out.shape[2:]), chunk_out], dim=1)

        keep = torch.tensor([*range(b), b + s - 1], device=ids.device)
        logits = self.step_graph(
            torch.cat([ids, chunk_ids])[None],
            torch.cat([positions, chunk_positions])[None],
            attend,
            keep,
        )
        return logits[:b], logits[b]

    def attend(  # noqa: PLR0917 - one layer's attention and its whole context
        self,
        q: torch.Tensor,  # [B, Q, Hq, D]
        k: torch.Tensor,  # [B, Q, Hkv, D]
        v: torch.Tensor,
        index: int,
        cache: KVBuffer,
        mask: torch.Tensor | None,  # [B, 1, Q|1, K] bool
        parts: Sequence[PrefixPart],
    ) -> torch.Tensor:
        """Write layer ``index``'s k/v into ``cache`` and attend; ``[B, Q, Hq, D]``."""
        keys, values = cache.layers[index].update(k.transpose(1, 2), v.transpose(1, 2))
        query = q.transpose(1, 2)
        if parts:
            return attention.merged_attention(query, keys, values, mask, self.scale, parts, index)
        return attention.plain_attention(query, keys, values, mask, self.scale)

    def step_graph(
        self,
        ids: torch.Tensor,  # [B, Q]
        positions: torch.Tensor,  # [B, Q]
        attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The forward's dense parts around ``attend(q, k, v, layer)`` per layer.

        Free of Python control flow that depends on the cache, so that ``compiled.py``
        can trace it with ``attend`` as an opaque op. Returns each row's last logits
        ``[B, V]``, or with ``keep`` (token indices of a one-row batch) theirs ``[n, V]``.
        """
        b, q_len = ids.shape
        hidden = self.embed(ids)
        cos, sin = self.rotary(hidden, positions)  # [B, Q, D]
        cos, sin = cos[:, :, None], sin[:, :, None]  # [B, Q, 1, D]
        nq, nkv, d = self.heads, self.kv_heads, self.head_dim
        for index, layer in enumerate(self.layers):
            x = rms_norm(hidden, layer.in_norm, layer.in_eps)
            qkv = layer.qkv(x).view(b, q_len, nq + 2 * nkv, d)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = rms_norm(qkv[:, :, :nq], *layer.q_norm)
                k = rms_norm(qkv[:, :, nq : nq + nkv], *layer.k_norm)
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            else:
                qk = _rotate(qkv[:, :, : nq + nkv], cos, sin)
                q, k = qk[:, :, :nq], qk[:, :, nq:]
            v = qkv[:, :, nq + nkv :]
            out = attend(q, k, v, index)
            hidden = hidden + layer.o(out.view(b, q_len, nq * d))
            x = rms_norm(hidden, layer.post_norm, layer.post_eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + layer.down(torch.nn.functional.silu(gate) * up)
        if keep is not None:
            last = rms_norm(hidden[0, keep].contiguous(), self.norm, self.norm_eps)
            return self.lm_head(last).float()
        return self._last_logits(hidden)

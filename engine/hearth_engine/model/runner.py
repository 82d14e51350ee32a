"""The model runner: forward passes over ``KVBuffer`` working caches.

The hot path is a few small functions (in the spirit of gpt-fast): ``prefill`` runs one
chunk of one sequence, ``decode`` runs one token for every row of a batch. Everything
else (which tokens, which cache, which rows) is decided by the engine.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import native
from .attention import PARTS_KWARG, POSITIONS_KWARG, PrefixPart
from .decoder import LeanDecoder, unsupported_reason
from .errors import ModelLoadError
from .hardware import check_cpu_class, pick_device, pick_dtype
from .kv import KVBuffer, KVLayout, segment_tokens
from .layer_types import sliding_layers, state_layers
from .linear import Quantization, int8_unsupported
from .loader import LoadedModel, load_model
from .quant.linear import model_prefill_path
from .self_test import check_shared_prefix
from .step_compiler import CompileMode, CompileState, StepCompiler, wants_compile

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
    quantization: str = Quantization.NONE.value
    forward: str = "transformers"
    # The form of each kind of linear ({"qkv": {"int4-g32": 28}, ...}; /v1/stats).
    linears: dict[str, dict[str, int]] = field(default_factory=dict, hash=False, compare=False)
    # How packed linears meet prefill rows (quant.linear.prefill_path): integer or dense;
    # "" when none is packed.
    quant_prefill: str = ""

    @property
    def namespace(self) -> str:
        """Cache namespace: different models, dtypes or quantizations never share KV, nor
        do a packed model's prefills of int8 rows and of dequantized ones (a pin in the
        prefix store from the other path is computed again, not read)."""
        if self.quantization == Quantization.NONE:
            return f"{self.fingerprint}:{self.dtype}"
        rows = ":int8-prefill" if self.quant_prefill == "integer" else ""
        return f"{self.fingerprint}:{self.dtype}:{self.quantization}{rows}"


# Mamba-2 layers run transformers' reference chunked scan here (no ``mamba_ssm`` kernels).
# It pads every call to whole chunks: with the configs' 256 a 25-token suffix computes 256.
# The scan's result does not depend on the chunk size (only its rounding could); measured
# on Granite 4 tiny (10 layers, bfloat16, 2 threads): a 25-token warm suffix 655 -> 321
# ms, a cold 2,048-token prefill 10.0 -> 8.5 s, and the same logits, with 64.
SCAN_CHUNK_TOKENS = 64


def tune_scan_chunks(model: Any) -> int:
    """Cap the Mamba-2 mixers' scan chunk at ``SCAN_CHUNK_TOKENS``; returns how many."""
    tuned = 0
    for module in model.modules():
        if "Mamba" in type(module).__name__ and isinstance(
            getattr(module, "chunk_size", None), int
        ):
            module.chunk_size = min(module.chunk_size, SCAN_CHUNK_TOKENS)
            tuned += 1
    return tuned


class Forward(enum.StrEnum):
    """Which forward pass runs the model (``--forward``)."""

    AUTO = "auto"  # the lean one where the model is supported (decoder.py)
    LEAN = "lean"  # the lean one, or refuse to start
    TRANSFORMERS = "transformers"


def pick_lean(model: Any, forward: Forward, quantization: Quantization) -> bool:
    """Whether to run the lean forward; a one-line ``ModelLoadError`` when impossible."""
    reason = unsupported_reason(model)
    if quantization != Quantization.NONE:
        if reason is not None and quantization == Quantization.GGUF:
            raise ModelLoadError(
                f"a quantized GGUF file is served packed only by the lean forward, which does "
                f"not support {reason} (--quantize none dequantizes it)"
            )
        if forward == Forward.TRANSFORMERS:
            raise ModelLoadError(f"--quantize {quantization} needs --forward auto or lean")
        if reason is not None:
            raise ModelLoadError(f"--quantize {quantization} is not supported for {reason}")
    if forward == Forward.LEAN and reason is not None:
        raise ModelLoadError(f"--forward lean is not supported for {reason}")
    if forward == Forward.AUTO and reason is not None:
        _LOGGER.info("transformers forward: the lean one does not support %s", reason)
    return forward != Forward.TRANSFORMERS and reason is None


def serve_packed(spec: str, quantize: str, device: torch.device) -> bool | None:
    """Whether a quantized file's matrices (the default model's too) may stay packed:
    ``None`` lets the file decide, ``False`` dequantizes it.

    ``--quantize auto`` keeps them packed where their kernels run: Hearth's native ones,
    on a CPU, built now if this host has no build yet (a first start waits for it, 35 s
    to a minute). Any other ``--quantize``, a GPU, or kernels that cannot be had start
    from the dequantized weights. A model folder is served as it is."""
    if spec != "default" and not spec.lower().endswith(".gguf"):
        return None
    if quantize != "auto" or device.type != "cpu":
        return False
    if native.load() is None:
        _LOGGER.warning(
            "Quantized weights are served dequantized: Hearth's native kernels are %s",
            f"unavailable ({native.error()})" if native.enabled() else "off (HEARTH_NATIVE=0)",
        )
        return False
    return None


class ModelRunner:
    """Owns the model; all its methods run on the engine's worker thread."""

    def __init__(
        self,
        loaded: LoadedModel,
        device: torch.device,
        dtype: torch.dtype,
        quantization: Quantization = Quantization.NONE,
        forward: Forward = Forward.AUTO,
        *,
        compile_mode: CompileMode = CompileMode.OFF,
        compile_batches: Sequence[int] = (1,),
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        text_config = self.model.config.get_text_config(decoder=True)
        heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        sliding, window = sliding_layers(self.model.config)
        states = state_layers(self.model.config)
        self.layout = KVLayout(
            layers=text_config.num_hidden_layers - len(states),
            kv_heads=getattr(text_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
            sliding=sliding,
            window=window,
            state_layers=states,
        )
        if states and device.type == "cpu":
            tune_scan_chunks(self.model)
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        if quantization == Quantization.INT8 and (problem := int8_unsupported(device, dtype)):
            raise ModelLoadError(f"--quantize int8: {problem}")
        self.lean: LeanDecoder | None = None
        if pick_lean(self.model, forward, quantization):
            compiles = wants_compile(compile_mode, self.layout)
            self.lean = LeanDecoder(self.model, quantization, share_embedding=not compiles)
        # The compiled decode step (step_compiler.py); ``start_compile`` starts it.
        self.compiler: StepCompiler | None = None
        if self.lean is not None and wants_compile(compile_mode, self.layout):
            self.compiler = StepCompiler(self.lean, self.layout, compile_batches)
        self.info = ModelInfo(
            name=loaded.name,
            path=str(loaded.path),
            fingerprint=loaded.fingerprint,
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            context_length=loaded.context_length,
            bytes_per_token=self.layout.bytes_per_token,
            vocab_size=int(text_config.vocab_size),
            quantization=quantization.value,
            forward="lean" if self.lean is not None else "transformers",
            linears=self.lean.linear_forms() if self.lean is not None else {},
            quant_prefill=(
                model_prefill_path(self.lean.linears(), dtype)
                if self.lean is not None and device.type == "cpu"
                else ""
            ),
        )

    @classmethod
    def load(
        cls,
        spec: str,
        device: str = "auto",
        dtype: str = "auto",
        quantize: str = "auto",
        forward: str = "auto",
        *,
        compile_mode: str = "off",
        chat_template: str | None = None,
        max_context: int | None = None,
    ) -> ModelRunner:
        check_cpu_class()  # HEARTH_CPU: refused here, else logged
        dev = pick_device(device)
        dt = pick_dtype(dev, dtype)
        started = time.monotonic()
        packed = serve_packed(spec, quantize, dev)
        loaded = load_model(spec, dev, dt, chat_template, packed)
        if max_context is not None and max_context < loaded.context_length:
            loaded.context_length = max_context  # --max-context
        if dev.type == "cpu" and not loaded.packed:
            # Hearth's C++ kernels (native.py): loaded now when built, so that the lean
            # forward prepares its decode tiles (linear.py); else built in the background.
            native.prepare()
        mode = CompileMode(compile_mode)
        if quantize == "auto":
            quantization = Quantization.GGUF if loaded.packed else Quantization.NONE
        else:
            quantization = Quantization(quantize)
        runner = cls(loaded, dev, dt, quantization, Forward(forward), compile_mode=mode)
        _LOGGER.info(
            "Loaded %s on %s as %s (%s forward, quantize %s) in %.1f s",
            loaded.name,
            dev,
            dt,
            runner.info.forward,
            quantization.value,
            time.monotonic() - started,
        )
        runner.start_compile()
        return runner

    def start_compile(self) -> None:
        """Start compiling the decode step in the background (when asked for)."""
        if self.compiler is not None:
            self.compiler.start()

    @property
    def compile_state(self) -> str:
        """``off``, ``compiling``, ``active`` or ``failed`` (for ``/v1/stats``)."""
        return CompileState.OFF if self.compiler is None else self.compiler.state

    @functools.cached_property
    def shares_prefix(self) -> bool:
        """Whether attention can read cached prefixes in place (``self_test.py``, run once).

        Not for hybrid models: their KV holds the attention layers only, so a segment's
        layer index is not the model's (their prefixes are copied; only a quarter to a
        tenth of their layers have KV to copy)."""
        return not self.layout.state_layers and check_shared_prefix(self)

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
        if self.lean is not None:
            with torch.inference_mode():
                return self.lean.forward(ids, positions, cache, attention_mask, parts)
        kwargs: dict[str, Any] = {self._cache_kwarg: cache}
        if parts:  # reaches the attention function (see attention.py)
            kwargs[PARTS_KWARG] = tuple(parts)
            # A sliding layer places the parts against its window (also a window longer
            # than the context, as Phi-4-mini's, which never slides but is passed).
            kwargs[POSITIONS_KWARG] = positions
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

    def prefill(
        self,
        cache: KVBuffer,
        token_ids: list[int],
        shared: Sequence[torch.Tensor] = (),
        window: PrefixPart | None = None,
    ) -> torch.Tensor:
        """Append ``token_ids`` to the single-row ``cache``; logits of the last one: [V].

        ``shared`` are cached segments ``[L, 2, H, T, D]`` that precede the cache's own
        tokens and are read in place (see ``attention``); ``window``, the sliding layers'
        last tokens before them, for a model that trims its windows.
        """
        device = self.layout.device
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)  # [1, S]
        positions = self._chunk_positions(cache, len(token_ids), shared)[None, :]
        parts = self.prefix_parts(shared, window)
        return self._forward(ids, positions, cache, None, parts)[0]

    def prefix_parts(
        self, shared: Sequence[torch.Tensor], window: PrefixPart | None = None
    ) -> list[PrefixPart]:
        """The parts one row reads in place: its ``shared`` segments in path order (of
        ``KVLayout.segment_layers``), then its sliding ``window`` if it has one."""
        layers = self.layout.segment_layers if self.layout.trims_windows else None
        parts = [PrefixPart(s, layers=layers) for s in shared]
        return [*parts, window] if window is not None else parts

    def as_cached(self, prefix: torch.Tensor) -> tuple[list[torch.Tensor], PrefixPart | None]:
        """A prefix's whole KV ``[L, 2, H, T, D]`` (tokens ``[0, T)``) as the cache keeps
        it: the ``prefill`` arguments ``shared`` and ``window`` that read it in place."""
        layout = self.layout
        if not layout.trims_windows:
            return [prefix], None
        total = prefix.shape[3]
        kept = layout.window_tokens(total)
        tail = prefix[list(layout.sliding), :, :, total - kept :]
        window = PrefixPart(tail, layers=layout.sliding, start=total - kept)
        return [prefix[list(layout.segment_layers)]], window

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
        if self.compiler is not None:
            with torch.inference_mode():
                logits = self.compiler.step(ids, pos, cache, attention_mask, parts)
            if logits is not None:
                return logits
        return self._forward(ids, pos, cache, attention_mask, parts)

    def _chunk_positions(
        self, cache: KVBuffer, n: int, shared: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """The absolute positions ``[n]`` of ``n`` tokens appended to a single-row
        ``cache`` that follows the ``shared`` segments."""
        start = sum(segment_tokens(s) for s in shared) + cache.length
        return torch.arange(start, start + n, device=self.layout.device)

    @property
    def can_mix(self) -> bool:
        """Whether a decode step and a prefill chunk can share one forward (``mixed``):
        the lean forward, run eager."""
        return self.lean is not None and self.compiler is None

    def mixed(  # noqa: PLR0917 - a decode step's and a prefill chunk's inputs
        self,
        cache: KVBuffer,
        token_ids: list[int],
        positions: list[int],
        attention_mask: torch.Tensor | None,
        parts: Sequence[PrefixPart],
        chunk_cache: KVBuffer,
        chunk_ids: list[int],
        chunk_shared: Sequence[torch.Tensor] = (),
        chunk_window: PrefixPart | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode`` and ``prefill`` in one forward (``LeanDecoder.forward_mixed``): the
        decode rows' logits ``[B, V]`` and the chunk's last ``[V]``."""
        if self.lean is None:
            raise RuntimeError("a mixed step needs the lean forward")
        device = self.layout.device
        with torch.inference_mode():
            return self.lean.forward_mixed(
                torch.tensor(token_ids, dtype=torch.long, device=device),
                torch.tensor(positions, dtype=torch.long, device=device),
                cache,
                attention_mask,
                parts,
                torch.tensor(chunk_ids, dtype=torch.long, device=device),
                self._chunk_positions(chunk_cache, len(chunk_ids), chunk_shared),
                chunk_cache,
                self.prefix_parts(chunk_shared, chunk_window),
            )

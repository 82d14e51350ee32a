"""Which form a quantized file is served in (runner.serve_packed): packed where Hearth's
kernels run, dequantized anywhere else (no model is loaded here)."""

from __future__ import annotations

import pytest
import torch

from hearth_engine.model import native, runner

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def test_the_default_and_gguf_files_stay_packed_where_the_kernels_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(native, "load", object)  # a loaded module stands in
    assert runner.serve_packed("default", "auto", CPU) is None  # the file decides: packed
    assert runner.serve_packed("/models/x.Q4_K_M.GGUF", "auto", CPU) is None
    assert runner.serve_packed("default", "none", CPU) is False  # bf16, as asked
    assert runner.serve_packed("default", "int8", CPU) is False
    assert runner.serve_packed("default", "auto", GPU) is False  # the kernels are CPU ones
    assert runner.serve_packed("/models/folder", "none", CPU) is None  # a folder as it is


def test_without_the_kernels_the_file_is_dequantized_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native, "load", lambda: None)
    monkeypatch.setattr(native, "enabled", lambda: False)
    assert runner.serve_packed("default", "auto", CPU) is False
    assert "HEARTH_NATIVE=0" in caplog.text

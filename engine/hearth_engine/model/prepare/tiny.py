"""Tiny test models, built locally in seconds (no hub).

* ``tiny``: a Qwen2-architecture model with random weights (2 layers, hidden 128,
  GQA 4/2 heads) and a byte-level BPE tokenizer trained on a synthetic corpus. Random
  weights give long, varied greedy outputs, which is what exactness tests need.
* ``tiny-tools``: the same tokenizer and a slightly wider model (hidden 256), trained
  for five to ten minutes on 2 cores (once, then cached) on scripted dialogues so that its greedy
  output is known in advance, also deep inside a 2k-token prompt:

  - a user turn with ``turn on the kitchen light`` (or any ``turn on the kitchen ...``,
    which training never contrasts with it) is answered with
    ``TOOLS_MODEL_CALL`` (a Hermes tool call of ``HassTurnOn``);
  - the turn after a ``<tool_response>`` is answered with ``TOOLS_MODEL_DONE``;
  - any other user turn is answered with ``TOOLS_MODEL_REPLY``.

  It exists so that tool loops can be tested end to end against a real engine with
  deterministic output. The build checks these behaviours and fails if training did
  not converge, so a broken model is never cached.

Both use the Hermes ChatML template of the default model.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cache_dir import build_once, models_dir
from .corpus import corpus_lines, filler_text, tool_json, user_phrase
from .templates import HERMES_CHATML_TEMPLATE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

_LOGGER = logging.getLogger(__name__)

TOKENIZER_VERSION = "bpe4096/1"
TINY_VERSION = f"tiny/3+{TOKENIZER_VERSION}"  # 3: the template takes hearth_house
TOOLS_VERSION = f"tiny-tools/8+{TOKENIZER_VERSION}"

# Qwen2's pre-tokenizer pattern: AutoTokenizer must re-tokenize exactly like training.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 4096

TOOLS_MODEL_TRIGGER = "turn on the kitchen light"
TOOLS_MODEL_CALL = {"name": "HassTurnOn", "arguments": {"name": "Kitchen Light"}}
TOOLS_MODEL_DONE = "Done, the light is on."
TOOLS_MODEL_REPLY = "Hello from Hearth."
LEARNING_RATE = 3e-3
LONG_EVERY = 3
CHECKPOINTS = (500, 600, 700, 800, 1000, 1200, 1400, 1600, 2000)
# The learning rate's cosine ends here; later checkpoints train on at its last rate, for
# hosts whose floating point converges slower (a 2-vCPU Xeon with AMX: 5 self-check
# failures left at 1,200, none at 1,400). A host that converges by 1,200 trains exactly as
# before.
SCHEDULE_STEPS = 1200
# The self-check must also pass here or later: stopping at the first clean checkpoint
# left a model, on some hosts, that held only for the training dialogues themselves.
MIN_STEPS = 500
GREETINGS = ("hi", "hello", "hey", "good evening", "good morning", "thanks")


def tiny_model_dir() -> Path:
    return models_dir() / "tiny"


def tiny_tools_model_dir() -> Path:
    return models_dir() / "tiny-tools"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer (deterministic: same corpus, one thread)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=HERMES_CHATML_TEMPLATE,
        model_max_length=32768,
    )
    fast.add_tokens(ADDED_TOKENS)
    return fast


def _config(tokenizer: PreTrainedTokenizerFast, hidden: int = 128) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _random_model(tokenizer: PreTrainedTokenizerFast, hidden: int = 128) -> Any:
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config(tokenizer, hidden)).eval()
    model.generation_config.do_sample = False
    return model


def _build_tiny(out: Path) -> None:
    tokenizer = build_tokenizer()
    _random_model(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)


def prepare_tiny_model() -> Path:
    """The random-weight test model (built once into the cache, ~2 s)."""
    return build_once(tiny_model_dir(), TINY_VERSION, _build_tiny)


# --- tiny-tools: a few seconds of training on scripted dialogues -------------------------


def _tools(rng: random.Random) -> list[dict[str, Any]] | None:
    """Tool schemas in the system prompt, as Home Assistant sends them (or none)."""
    if rng.random() < 0.5:
        return None
    return [json.loads(tool_json(rng)) for _ in range(rng.randint(1, 4))]


def _tool_result(rng: random.Random) -> dict[str, Any]:
    """A tool result: a short generic one, the shape of Home Assistant's intents, or an
    error as the integration reports one (the reply after it is scripted the same: a
    model trained on successes only called again after an error on some hosts)."""
    target = filler_text(rng, 1)
    if rng.random() < 0.3:
        kind = rng.choice(["MatchFailedError", "NotRequested", "InvalidArguments", "Error"])
        return {"error": kind, "error_text": target}
    if rng.random() < 0.5:
        return {"success": rng.random() < 0.8, "data": {"targets": [target]}}
    return {
        "speech": {},
        "response_type": "action_done",
        "data": {
            "targets": [],
            "success": [{"name": target[:40], "type": "entity", "id": "light.kitchen_light"}],
            "failed": [],
        },
    }


def _user_text(rng: random.Random) -> str:
    """Any user turn that is not the trigger (``turn on ...`` is never contrasted)."""
    if rng.random() < 0.25:
        return rng.choice(GREETINGS)
    phrase = user_phrase(rng)
    while phrase.startswith("turn on"):
        phrase = user_phrase(rng)
    return phrase


Dialogue = tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]


def _dialogue(rng: random.Random, long: bool = False) -> Dialogue:
    """One training conversation, its tools, and the assistant text expected after it."""
    lines = rng.randint(20, 60) if long else rng.randint(0, 2)
    tools = _tools(rng)
    messages: list[dict[str, Any]] = [{"role": "system", "content": filler_text(rng, lines)}]
    for _ in range(rng.choice([0, 0, 0, 1])):
        messages.append({"role": "user", "content": user_phrase(rng)})
        messages.append({"role": "assistant", "content": TOOLS_MODEL_REPLY})
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": filler_text(rng, 1)})
    kind = rng.random()
    if kind < 0.4:
        text = TOOLS_MODEL_TRIGGER
        if rng.random() < 0.5:
            text = rng.choice(["please ", "hey, ", "can you "]) + text
        messages.append({"role": "user", "content": text})
        return messages, tools, f"<tool_call>\n{json.dumps(TOOLS_MODEL_CALL)}\n</tool_call>"
    if kind < 0.7:
        messages.append({"role": "user", "content": TOOLS_MODEL_TRIGGER})
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": TOOLS_MODEL_CALL}],
            }
        )
        messages.append({"role": "tool", "content": json.dumps(_tool_result(rng))})
        return messages, tools, TOOLS_MODEL_DONE
    messages.append({"role": "user", "content": _user_text(rng)})
    return messages, tools, TOOLS_MODEL_REPLY


def _encode(
    tokenizer: PreTrainedTokenizerFast,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _batch(
    rng: random.Random, tokenizer: PreTrainedTokenizerFast, long: bool, size: int
) -> tuple[Any, Any, Any]:
    import torch

    end, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batch_ids, batch_labels = [], []
    for _ in range(2 if long else size):
        messages, tools, target = _dialogue(rng, long)
        prompt = _encode(tokenizer, messages, tools)
        answer = [*tokenizer(target, add_special_tokens=False)["input_ids"], end]
        batch_ids.append(prompt + answer)
        batch_labels.append([-100] * (len(prompt) - 1) + answer + [-100])
    width = max(map(len, batch_ids))
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in batch_ids])
    labels = torch.tensor([row + [-100] * (width - len(row)) for row in batch_labels])
    # Random position offsets: positions seen in long prompts, at short-prompt cost.
    positions = torch.arange(width)[None, :] + torch.randint(0, 8000, (ids.shape[0], 1))
    return ids, labels, positions


def _train(
    model: Any, tokenizer: PreTrainedTokenizerFast, checkpoints: tuple[int, ...], seed: int
) -> Any:
    """Train, yielding at each checkpoint step so the caller can stop early.

    Every ``LONG_EVERY``-th step is a pair of long prompts, so the model learns to find
    the trigger far from the start (a real house prefix is thousands of tokens).
    """
    import math

    import torch

    rng = random.Random(seed)
    total = min(SCHEDULE_STEPS, checkpoints[-1])
    optim = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)

    def lr_factor(step: int) -> float:
        if step < 30:
            return (step + 1) / 30
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, total) / total))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_factor)
    for step in range(checkpoints[-1]):
        model.train()
        ids, labels, positions = _batch(rng, tokenizer, step % LONG_EVERY == LONG_EVERY - 1, 8)
        optim.zero_grad()
        _backward(model, ids, labels, positions)
        optim.step()
        sched.step()
        if step + 1 in checkpoints:
            model.eval()
            yield step + 1


def _backward(model: Any, ids: Any, labels: Any, positions: Any) -> None:
    """Gradients of the mean cross entropy over the labelled tokens (the answers).

    The same loss as one forward of the padded batch, for a quarter less time: the rows
    go in two halves sorted by length, each cut to its own longest row (padding sits
    after every answer and no real token attends to it), and the head and the softmax
    run only on the labelled positions (a few dozen of each row's hundreds)."""
    import torch

    labelled = labels != -100
    total = int(labelled.sum())
    ends = labelled.cumsum(dim=1).argmax(dim=1)  # each row's last labelled position
    order = torch.argsort(ends)
    for part in (order[: len(order) // 2], order[len(order) // 2 :]):
        if len(part) == 0:
            continue
        width = int(ends[part].max()) + 1
        hidden = model.model(
            input_ids=ids[part, :width], position_ids=positions[part, :width]
        ).last_hidden_state
        keep = labelled[part, :width]
        logits = model.lm_head(hidden[keep])
        loss = torch.nn.functional.cross_entropy(
            logits, labels[part, :width][keep], reduction="sum"
        )
        (loss / total).backward()


def _greedy(model: Any, ids: list[int], max_new: int, end: int) -> list[int]:
    import torch

    out: list[int] = []
    with torch.inference_mode():
        result = model(input_ids=torch.tensor([ids]), use_cache=True)
        for _ in range(max_new):
            nxt = int(result.logits[0, -1].argmax())
            if nxt == end:
                break
            out.append(nxt)
            result = model(input_ids=torch.tensor([[nxt]]), cache=result.cache, use_cache=True)
    return out


def _self_check(model: Any, tokenizer: PreTrainedTokenizerFast, samples: int = 48) -> list[Any]:
    """Dialogues (a quarter of them long) whose greedy reply is not the scripted one."""
    rng = random.Random(12345)
    failures = []
    for i in range(samples):
        messages, tools, target = _dialogue(rng, long=i % 4 == 0)
        got = tokenizer.decode(
            _greedy(model, _encode(tokenizer, messages, tools), 40, tokenizer.eos_token_id)
        )
        if got != target:
            failures.append((target, got))
    return failures


def _build_tools(out: Path) -> None:
    """Train until the self-check passes (checked at a few points, so a machine whose
    floating point converges slower trains longer instead of failing); refuse to cache
    a model that never gets there."""
    import torch

    torch.manual_seed(1)
    tokenizer = build_tokenizer()
    # Hidden 256: at 128 the model garbles its memorized reply in 1-2k-token prompts.
    model = _random_model(tokenizer, hidden=256)
    failures: list[Any] = []
    for step in _train(model, tokenizer, CHECKPOINTS, seed=1):
        failures = _self_check(model, tokenizer)
        _LOGGER.info("tiny-tools: step %d, %d self-check failures", step, len(failures))
        if not failures and step >= MIN_STEPS:
            break
    if failures:
        raise RuntimeError(f"tiny-tools training did not converge: {failures[:3]}")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def prepare_tiny_tools_model() -> Path:
    """The scripted tool-calling test model (trained once into the cache)."""
    return build_once(tiny_tools_model_dir(), TOOLS_VERSION, _build_tools)

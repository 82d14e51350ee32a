"""Speak: what a turn says of its tool calls, in place of the model's words.

After an action the turn ends with what Home Assistant reported was done
(turn/result_speech.py: HA's own sentence for the intent, else the agent's "Done.");
where calls failed, each error's sentence and what the others did; where the guard
refused them (turn/call.py), a request to say it another way. A reply that is not speech
is replaced by ``fallback``; a model's words that ask the user something stay
(``asks``). ``say`` ends the turn with such words in the chat log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from homeassistant.components import conversation
from homeassistant.core import HomeAssistant, callback

from ..errors import async_spoken
from ..language.questions import is_question
from .prompt import HearthNative
from .refusal import NOT_FOR_REQUEST
from .result_speech import (
    Outcome,
    Responses,
    async_responses,
    last_outcomes,
    render_response,
    spoken_outcomes,
)


@dataclass(frozen=True, slots=True)
class Speech:
    """The agent's phrases in the request's ``language``, and the request's ``text``
    (the things HA acted on that it does not name are named)."""

    text: str
    language: str
    responses: Responses
    done: str  # "Done.": where HA has no sentence of its own for an action
    fallback: str  # what is said in place of a reply that is not speech
    spoken: bool  # a conversation (speech); an AI Task's reply is structured data
    ask: str = ""  # what is said where the guard refused the calls: say it another way
    unchanged: str | None = None  # what is said where HA's action reached no target

    @classmethod
    async def async_of(
        cls, hass: HomeAssistant, text: str, language: str, *, spoken: bool
    ) -> Speech:
        """The speech of a turn whose request is ``text``, in ``language``."""
        return cls(
            text,
            language,
            responses=await async_responses(hass, language),
            done=await async_spoken(hass, language, "action_done"),
            fallback=await async_spoken(hass, language, "markup_only"),
            spoken=spoken,
            ask=await async_spoken(hass, language, "not_run"),
            unchanged=await async_spoken(hass, language, "nothing_changed"),
        )

    def speech(self, hass: HomeAssistant, content: Sequence[conversation.Content]) -> str | None:
        """What the turn says after its last tool calls (None: the model goes on)."""
        return self._said(hass, last_outcomes(content)) if self.spoken else None

    def _said(self, hass: HomeAssistant, outcomes: Sequence[Outcome]) -> str | None:
        return spoken_outcomes(
            outcomes,
            self.text,
            partial(render_response, hass, self.responses.intents),
            self.done,
            partial(self.responses.failed, hass),
            unchanged=self.unchanged,
        )

    def error_speech(
        self, hass: HomeAssistant, content: Sequence[conversation.Content]
    ) -> str | None:
        """What Assist says of the turn's last tool calls where some failed: each error's
        sentence, and what the others did (None: none failed)."""
        outcomes = last_outcomes(content)
        if not self.spoken or not any(outcome.error for outcome in outcomes):
            return None
        said = [
            (self.ask if _not_run(outcome) else self.responses.error(hass, outcome))
            if outcome.error
            else self._said(hass, [outcome])
            for outcome in outcomes
        ]
        return " ".join(dict.fromkeys(s for s in said if s)) or None

    def asks(self, text: str) -> bool:
        """Whether the model's ``text`` asks the user something (a clarifying question)."""
        return is_question(text, self.language)


def _not_run(outcome: Outcome) -> bool:
    """Whether the guard refused the call (guard.NOT_FOR_REQUEST)."""
    return str(outcome.result.get("error_text") or "").startswith(NOT_FOR_REQUEST)


@callback
def say(chat_log: conversation.ChatLog, agent_id: str, said: str) -> None:
    """End the turn saying ``said`` (not the model's words; kept in the history)."""
    message = {"role": "assistant", "content": said}
    chat_log.async_add_assistant_content_without_tools(
        conversation.AssistantContent(
            agent_id=agent_id, content=said, native=HearthNative(context=None, message=message)
        )
    )

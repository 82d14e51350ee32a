"""A question Home Assistant's own sentences read is answered by Home Assistant.

"Which lights are on in the kitchen?" matches a template of HA's question intent
whole. HA's handler then reads the exposed house and its response template says the
answer in the user's language ("Under Cabinet Lights"). The default model, given the
same live context, answered "The kitchen is off". So before the model, a turn tries
HA's strict matching (``conversation.async_handle_intents``, what a pipeline that
prefers local intents runs first), limited to HA's question intents: reading never
acts, so nothing is done that the agent did not decide. Where HA does not match, or
its answer reads nothing of the house (a template for covers asked of windows that are
sensors), the model answers from live context as before.
"""

from __future__ import annotations

import dataclasses

from hassil.recognize import RecognizeResult
from homeassistant.components import conversation
from homeassistant.core import HomeAssistant
from homeassistant.helpers import intent

from ..house.names import normalize
from ..house.values import house_names
from ..language.questions import QUESTION_INTENTS

_ANSWER = intent.IntentResponseType.QUERY_ANSWER


def _not_a_question(result: RecognizeResult) -> bool:
    """The filter HA takes: True leaves a match out (it would act, or is no question)."""
    return result.intent.name not in QUESTION_INTENTS


def _grounded(response: intent.IntentResponse) -> bool:
    """Whether HA's answer read some thing of the house: a state question whose
    template read a kind the house has none of ("are any windows open" reads covers;
    the windows are sensors) is answered "No" by HA, from nothing. HA's pipeline leaves
    state questions to an LLM agent for such readings; the model answers those."""
    asked = response.intent.intent_type if response.intent is not None else None
    if asked != intent.INTENT_GET_STATE:
        return True
    return bool(response.matched_states or response.unmatched_states)


async def _async_answer(
    hass: HomeAssistant,
    user_input: conversation.ConversationInput,
    chat_log: conversation.ChatLog,
) -> intent.IntentResponse | None:
    """HA's grounded answer to ``user_input`` as a question of its own (None: none)."""
    response = await conversation.async_handle_intents(
        hass, user_input, chat_log, intent_filter=_not_a_question
    )
    if response is None or response.response_type is not _ANSWER:
        return None
    return response if _grounded(response) else None


async def async_ha_answer(
    hass: HomeAssistant,
    user_input: conversation.ConversationInput,
    chat_log: conversation.ChatLog,
) -> conversation.ConversationResult | None:
    """HA's answer to the turn's question, added to the chat log; None where HA's own
    sentences do not read it as a question whole, or it answered with no speech. A
    question that says a name inflected ("Które światła są włączone w kuchni?" says
    the area "Kuchnia") is read again with the names as the house writes them: HA's
    templates read a name only as written."""
    response = await _async_answer(hass, user_input, chat_log)
    if response is None:  # the house's names are read only when HA did not answer
        spelled = house_names(hass).spelled(user_input.text)
        if spelled != normalize(user_input.text):
            asked = dataclasses.replace(user_input, text=spelled)
            response = await _async_answer(hass, asked, chat_log)
    if response is None:
        return None
    speech = str(response.speech.get("plain", {}).get("speech", "")).strip()
    if not speech:
        return None
    chat_log.async_add_assistant_content_without_tools(
        conversation.AssistantContent(agent_id=user_input.agent_id, content=speech)
    )
    return conversation.ConversationResult(
        response=response, conversation_id=chat_log.conversation_id
    )

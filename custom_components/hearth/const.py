"""Constants for the Hearth integration."""

import logging
from datetime import timedelta
from typing import Final

from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT
from homeassistant.helpers import llm

DOMAIN: Final = "hearth"
LOGGER = logging.getLogger(__package__)

DEFAULT_URL: Final = "http://127.0.0.1:8765"
DEFAULT_NAME: Final = "Hearth"
DEFAULT_CONVERSATION_NAME: Final = "Hearth"
SUBENTRY_CONVERSATION: Final = "conversation"
SUBENTRY_AI_TASK: Final = "ai_task_data"  # the subentry type HA core's LLM integrations use
DEFAULT_AI_TASK_NAME: Final = "Hearth AI Task"

# Conversation agent (subentry) options.
CONF_MAX_HISTORY: Final = "max_history"
CONF_TEMPERATURE: Final = "temperature"
CONF_MAX_TOKENS: Final = "max_tokens"
CONF_REPIN_DEBOUNCE: Final = "repin_debounce"
CONF_TOOL_FIRST: Final = "tool_first"
CONF_EXAMPLES: Final = "examples"
CONF_READ_FIRST: Final = "read_first"

DEFAULT_MAX_HISTORY: Final = 10  # earlier turns re-sent with each request
DEFAULT_TEMPERATURE: Final = 0.0  # greedy, the engine's default
DEFAULT_MAX_TOKENS: Final = 256
DEFAULT_REPIN_DEBOUNCE: Final = 2.0  # seconds of quiet before a re-pin
# Each turn's first request must call a tool (tool_choice "required"): HA's Assist API
# answers every home request through a tool (an intent, or GetLiveContext to read
# states); small models otherwise answer from nothing ("The garage door is open.").
# Off by default: forced to call something, a small model may act on small talk.
DEFAULT_TOOL_FIRST: Final = False
# Worked examples of the house's tools in the pinned prefix (prefix/examples.py): they took the
# default model from 0 to 27 of 71 right answers on the accuracy dataset (README).
DEFAULT_EXAMPLES: Final = True
# An English question's turn starts by reading the house (GetLiveContext; language/questions.py):
# small models otherwise answer from nothing, or act ("Is the door locked?" unlocked it).
DEFAULT_READ_FIRST: Final = True

RECOMMENDED_CONVERSATION_OPTIONS: Final = {
    CONF_PROMPT: llm.DEFAULT_INSTRUCTIONS_PROMPT,
    CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
    CONF_MAX_HISTORY: DEFAULT_MAX_HISTORY,
    CONF_TEMPERATURE: DEFAULT_TEMPERATURE,
    CONF_MAX_TOKENS: DEFAULT_MAX_TOKENS,
    CONF_REPIN_DEBOUNCE: DEFAULT_REPIN_DEBOUNCE,
    CONF_TOOL_FIRST: DEFAULT_TOOL_FIRST,
    CONF_EXAMPLES: DEFAULT_EXAMPLES,
    CONF_READ_FIRST: DEFAULT_READ_FIRST,
}

# AI Task (subentry) options: the instructions come from each task, not the subentry.
DEFAULT_AI_TASK_MAX_TOKENS: Final = 1024  # structured data is longer than a spoken reply
RECOMMENDED_AI_TASK_OPTIONS: Final = {
    CONF_TEMPERATURE: DEFAULT_TEMPERATURE,
    CONF_MAX_TOKENS: DEFAULT_AI_TASK_MAX_TOKENS,
}

# The chat loop: at most this many engine requests (tool rounds) per user turn.
MAX_TOOL_ITERATIONS: Final = 10

# Engine polling and timeouts.
SCAN_INTERVAL: Final = timedelta(seconds=10)
REQUEST_TIMEOUT: Final = 10.0  # seconds, for the small JSON routes
PIN_TIMEOUT: Final = 600.0  # seconds: a cold multi-thousand-token prefill on a CPU
# A reply that sends nothing for this long (its first token included: Hearth's engine
# answers the request once the first token is decoded) has stalled; the turn ends with a
# spoken sentence (``engine_stalled``). Why 25 s: a warm turn's first token is the suffix
# only (docs/models.md: 0.30 s for 32 tokens on a cached 2k prefix, 0.5B shape, 2 CPU
# threads; a 1.5B model about 3x that, and a few hundred suffix tokens about 3-10 s) and
# a decode step of a 1.5B model on such a CPU about 0.5 s, so 25 s is far past any sane
# gap. A *cold* 6k-token house prefill of a 1.5B model on 2 threads (about 3 x 16 s for
# 4k tokens of the 0.5B shape, so roughly 60-70 s) does not fit: the engine pins the
# house before turns (PIN_TIMEOUT covers that), and a turn that finds no pin then ends
# with "stalled" rather than holding the user for a minute. The Assist pipeline itself
# gives up far sooner than the old 300 s.
# The entry's options form sets it (config_flow_options.py: 5-120 s).
CONF_STALL_TIMEOUT: Final = "stall_timeout"
DEFAULT_STALL_TIMEOUT: Final = 25.0
# The served model's context in tokens, for a server that does not report it (the
# entry's options form; absent: unknown). What a server reports wins (backend/server_info.py).
CONF_CONTEXT_LENGTH: Final = "context_length"

# A burst of registry changes is merged into one re-pin, but a re-pin is never
# postponed by more than this many debounce periods.
REPIN_MAX_DELAY_FACTOR: Final = 10
# While a changed house is being re-pinned, requests keep the pinned (cached) prefix for
# at most this long; the changed lines travel in the context message meanwhile.
# A pin that tells changes since its base (prefix/delta.py) is rendered in full again
# once the house has been quiet this long (seconds).
FOLD_QUIET_S: Final = 3600.0
STALE_PREFIX_MAX_S: Final = 180.0

# Services.
SERVICE_REFRESH_PREFIX: Final = "refresh_prefix"
SERVICE_CLEAR_CACHE: Final = "clear_cache"
SERVICE_DASHBOARD: Final = "dashboard"
ATTR_CONFIG_ENTRY_ID: Final = "config_entry_id"

MIB: Final = 1024 * 1024

# Dispatcher signal (format with the subentry id): an agent's options changed.
SIGNAL_AGENT_OPTIONS_UPDATED: Final = f"{DOMAIN}_agent_options_updated_{{}}"

# Repairs: a pin rebuilt this many times within this window raises an issue (something
# keeps changing the house, or the engine keeps losing the pin); it clears itself once
# the window holds fewer rebuilds.
REBUILD_ISSUE_COUNT: Final = 10
REBUILD_ISSUE_WINDOW: Final = timedelta(hours=1)

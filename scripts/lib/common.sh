# Shared helpers for scripts/* (sourced, not run).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ENGINE_VENV="$ROOT/.venv/engine"
HA_VENV="$ROOT/.venv/ha"
HEARTH_CACHE="${HEARTH_CACHE_DIR:-$HOME/.cache/hearth}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
# Keep freed tensor memory in the process: page faults are slow on VMs (see hardware.py).
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1073741824}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-2147483647}"

log() { printf '\033[1;34m[hearth]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[hearth] error:\033[0m %s\n' "$*" >&2; exit 1; }

# A stamp per venv: the hash of the files that define it. Same hash = nothing to do.
stamp_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }

# step WHAT ABOUT COMMAND...: for work that can take more than ten seconds, one line before
# it starts (what it does, about how long), a line every 30 s while it runs (how long so
# far), and one when it is done (how long it took). The command runs in this shell, so
# `set -e` still stops at its first failure; the ticker ends with the step or the script.
STEP_TICK_S=${STEP_TICK_S:-30}
step() {
  local what=$1 about=$2 t0=$SECONDS owner=$BASHPID ticker
  shift 2
  log "$what (about $about) ..."
  step_ticker "$what" "$about" "$t0" "$owner" >/dev/null &
  ticker=$!
  "$@"
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  log "done: $what in $((SECONDS - t0)) s"
}

step_ticker() {  # what about t0 pid: a step's "still running" lines, while its shell lives
  local what=$1 about=$2 t0=$3 parent=$4 waited=0
  while sleep 1 && parent_is "$parent"; do
    ((++waited % STEP_TICK_S == 0)) && log "... $what: $((SECONDS - t0)) s so far (about $about)"
  done
  return 0
}

parent_is() {  # pid: whether this (sub)shell's parent is still pid (an exited one, even a
  # zombie not yet reaped, has handed its children on)
  local ppid _
  if [[ -r /proc/$BASHPID/stat ]]; then
    read -r _ _ _ ppid _ </proc/$BASHPID/stat
  else
    ppid=$(ps -o ppid= -p "$BASHPID" 2>/dev/null) || return 1
  fi
  [[ ${ppid// /} == "$1" ]]
}

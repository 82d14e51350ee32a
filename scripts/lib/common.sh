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
# it starts (what it does, about how long) and one when it is done (how long it took).
step() {
  local what=$1 about=$2 t0=$SECONDS
  shift 2
  log "$what (about $about) ..."
  "$@"
  log "done: $what in $((SECONDS - t0)) s"
}

"""``scripts/bench MODE ...``: ttft, concurrency, household, fuzz, load, faults, decode,
agreement, models, accuracy, compile, quant, first-speech."""

from __future__ import annotations

import importlib
import sys

# First: importing the engine's package caps torch to HEARTH_CPU, before a mode imports it.
from hearth_engine import cpu_class

MODES = {
    "ttft": "hearth_bench.ttft",
    "concurrency": "hearth_bench.concurrency",
    "household": "hearth_bench.household.main",
    "fuzz": "hearth_bench.fuzz.main",
    "load": "hearth_bench.load",
    "faults": "hearth_bench.faults",
    "decode": "hearth_bench.decode",
    "agreement": "hearth_bench.agreement",
    "models": "hearth_bench.models",
    "accuracy": "hearth_bench.accuracy.main",
    "compile": "hearth_bench.compile_step",
    "quant": "hearth_bench.quant.main",
    "first-speech": "hearth_bench.first_speech",
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        print(f"usage: scripts/bench {{{','.join(MODES)}}} [--help]", file=sys.stderr)
        return 2
    try:
        chosen = cpu_class.selected()
    except cpu_class.CpuClassError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # Timings belong to a class: an emulated one's are that class's best, on this host's memory.
    print(f"CPU class: {cpu_class.describe(chosen)}", flush=True)
    module = importlib.import_module(MODES[sys.argv[1]])
    return int(module.main(sys.argv[2:]))


if __name__ == "__main__":
    sys.exit(main())

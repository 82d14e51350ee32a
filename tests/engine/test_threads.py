"""Torch work off the caller's thread (hardware.on_passing_thread, Engine.load/start).

GNU OpenMP keeps a worker pool for each thread that ran a parallel region until that
thread ends, and with more pooled threads than CPUs every pool sleeps between regions,
which slowed decode steps 1.5x on a 2-core host. So the engine loads the model and
restores pins on a thread that ends, and only its worker keeps a pool.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hearth_engine.config import EngineConfig
from hearth_engine.model.hardware import on_passing_thread
from hearth_engine.serving import engine as engine_module
from hearth_engine.serving.engine import Engine


def test_on_passing_thread_returns_the_result_and_raises_the_error() -> None:
    caller = threading.get_ident()
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return threading.get_ident()

    assert on_passing_thread(work) != caller
    assert not seen[0].is_alive()

    def fail() -> None:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        on_passing_thread(fail)


def test_an_engine_loads_and_restores_off_the_callers_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: dict[str, threading.Thread] = {}
    load = engine_module.ModelRunner.load

    def recording_load(*args: Any, **kwargs: Any) -> Any:
        threads["load"] = threading.current_thread()
        return load(*args, **kwargs)

    monkeypatch.setattr(engine_module.ModelRunner, "load", recording_load)
    engine = Engine.load(EngineConfig(model="tiny", dtype="float32"))
    restore = engine.pins.restore_all

    def recording_restore() -> None:
        threads["restore"] = threading.current_thread()
        restore()

    monkeypatch.setattr(engine.pins, "restore_all", recording_restore)
    try:
        engine.start()
        for name in ("load", "restore"):
            assert threads[name] is not threading.current_thread()
            assert not threads[name].is_alive()
    finally:
        engine.close()

"""``HEARTH_CPU``: the engine run as a smaller x86 class on this host (cpu_class.py).

The class's flags and caps are pure functions of the class; a class the host lacks is
refused in one line; under ``avx2`` the engine sees no native bf16. Then for real, on
hosts that can run the classes: the compiler's own view of each class's flags (the
macros the kernels' ``#if`` guards read), an engine process started with
``HEARTH_CPU=avx2`` (its own kernel folder, float32, the class in ``/v1/stats``), and
the kernel exactness tests rerun under each class below the host's, whose kernels are
read back from the built file (no AVX-512 instruction in an ``avx2`` build, no AMX one
in an ``avx512`` build).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from hearth_engine import cpu_class
from hearth_engine.cpu_class import AMX, AVX2, AVX512, CLASSES, CpuClassError
from hearth_engine.model import hardware, native

from .conftest import ServerProcess, launch_server, run_serve

ROOT = Path(__file__).resolve().parents[2]
HOST = cpu_class.host_class()
# Whether this process runs under a class (the exactness reruns below start one).
OWN = os.environ.get(cpu_class.ENV, cpu_class.NATIVE)

# /proc/cpuinfo flags of the CPUs a house runs (the vector part, as Linux names it).
N100 = (
    "sse4_2 ssse3 sse4_1 popcnt cx16 lahf_lm avx avx2 bmi1 bmi2 f16c fma abm movbe xsave avx_vnni"
)
TIGER_LAKE = f"{N100} avx512f avx512bw avx512cd avx512dq avx512vl avx512_vnni avx512ifma"
ZEN4 = f"{TIGER_LAKE} avx512_bf16"
SAPPHIRE_RAPIDS = f"{ZEN4} avx512_fp16 amx_tile amx_bf16 amx_int8"


def below_host() -> list[str]:
    """The classes this host runs other than its own (its own is the plain suite's)."""
    names = list(CLASSES)
    return names[: names.index(HOST)] if HOST in names else []


def test_each_class_compiles_for_its_own_instruction_set() -> None:
    flags = {name: native.compile_flags("x86_64", cls) for name, cls in CLASSES.items()}
    assert "-march=x86-64-v3" in flags["avx2"]
    assert not any("avx512" in f or "amx" in f for f in flags["avx2"])
    assert {"-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"} <= set(flags["avx512"])
    assert not any("amx" in f for f in flags["avx512"])
    assert {"-march=x86-64-v4", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"} <= set(flags["amx"])
    for name, got in flags.items():
        assert "-march=native" not in got, name
        assert got[0] == "-O3" and got[-len(native.MATH_FLAGS) :] == native.MATH_FLAGS
    # without a class: the host's own, as before
    assert "-march=native" in native.compile_flags("x86_64")
    assert "-mcpu=native" in native.compile_flags("aarch64")
    assert len({*flags.values(), native.compile_flags("x86_64")}) == 4  # four cache keys


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_the_compiler_sees_each_class_as_the_kernels_guards_expect() -> None:
    """The macros the kernels branch on (vec.h, quant_avx512.h, quant_avx2.h,
    attention_amx.h), as the compiler defines them for each class's flags."""

    def macros(flags: tuple[str, ...]) -> set[str]:
        done = subprocess.run(
            ["c++", *flags, "-dM", "-E", "-x", "c++", "-"],
            input="",
            capture_output=True,
            text=True,
            check=True,
        )
        return set(re.findall(r"#define (__\w+__)", done.stdout))

    guards = {"__AVX2__", "__F16C__", "__FMA__", "__AVX512F__", "__AVX512BW__", "__AVX512VL__"}
    guards |= {"__AVX512VNNI__", "__AVX512BF16__", "__AMX_TILE__", "__AMX_BF16__"}
    seen = {name: macros(cls.march) & guards for name, cls in CLASSES.items()}
    assert seen["avx2"] == {"__AVX2__", "__F16C__", "__FMA__"}
    assert seen["avx512"] == guards - {"__AMX_TILE__", "__AMX_BF16__"}
    assert seen["amx"] == guards


def test_each_class_caps_torch_and_native_caps_nothing() -> None:
    assert cpu_class.environment(None) == {}
    assert cpu_class.environment(AVX2) == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    }
    assert cpu_class.environment(AVX512)["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    assert cpu_class.environment(AMX)["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_AMX"
    assert cpu_class.environment(AMX)["ATEN_CPU_CAPABILITY"] == "avx512"


@pytest.mark.skipif(HOST not in CLASSES, reason="an x86-64 host of at least AVX2")
def test_the_environment_is_set_for_a_class_the_host_runs_and_left_alone_otherwise() -> None:
    env = {cpu_class.ENV: "avx2", "ATEN_CPU_CAPABILITY": "avx512"}
    assert cpu_class.apply_environment(env) is AVX2
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    for value in ("native", "", "avx9"):
        untouched = {cpu_class.ENV: value}
        assert cpu_class.apply_environment(untouched) is None
        assert untouched == {cpu_class.ENV: value}


def test_a_class_above_the_host_is_refused_in_one_line() -> None:
    cases = {
        ("avx512", N100): "this CPU lacks avx512_bf16, avx512_vnni, avx512bw, avx512cd,",
        ("avx512", TIGER_LAKE): "this CPU lacks avx512_bf16 (it runs avx2, native)",
        ("amx", ZEN4): "this CPU lacks amx_bf16, amx_tile (it runs avx2, avx512, native)",
        ("avx2", "sse4_2 avx"): "lacks abm, avx2, bmi1",
    }
    for (name, flags), message in cases.items():
        with pytest.raises(CpuClassError, match=re.escape(message)) as err:
            cpu_class.resolve(name, flags.split(), "x86_64")
        assert "\n" not in str(err.value) and str(err.value).startswith(f"HEARTH_CPU={name}:")
    with pytest.raises(CpuClassError, match="x86-64 only"):
        cpu_class.resolve("avx2", [], "aarch64")
    with pytest.raises(CpuClassError, match="choose avx2, avx512, amx or native"):
        cpu_class.resolve("avx3", SAPPHIRE_RAPIDS.split(), "x86_64")
    # what each runs, and the highest class it is
    assert cpu_class.resolve("avx2", N100.split(), "x86_64") is AVX2
    assert cpu_class.resolve(" AMX ", SAPPHIRE_RAPIDS.split(), "x86_64") is AMX
    assert cpu_class.resolve("native", [], "aarch64") is None
    hosts = {N100: "avx2", TIGER_LAKE: "avx2", ZEN4: "avx512", SAPPHIRE_RAPIDS: "amx"}
    for flags, name in hosts.items():
        assert cpu_class.host_class(flags.split(), "x86_64") == name
    assert cpu_class.host_class([], "aarch64") == "aarch64"


def test_an_unknown_class_stops_the_engine_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the command line, before any model loads (exit code 2)."""
    monkeypatch.setenv(cpu_class.ENV, "avx3")
    done = run_serve("--model", "tiny", "--port", "1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("error: HEARTH_CPU=avx3: choose avx2, avx512, amx or native"), (
        done.stderr
    )


def test_a_class_sees_only_its_own_flags() -> None:
    host = SAPPHIRE_RAPIDS.split() + ["fpu", "sse2", "hypervisor"]
    avx2 = cpu_class.capped_flags(host, AVX2)
    assert "avx2" in avx2 and "fpu" in avx2 and "hypervisor" in avx2
    assert not {f for f in avx2 if f.startswith(("avx512", "amx"))} and "avx_vnni" not in avx2
    avx512 = cpu_class.capped_flags(host, AVX512)
    assert "avx512_bf16" in avx512 and not {"amx_tile", "amx_bf16", "avx512_fp16"} & avx512
    assert cpu_class.capped_flags(host, None) == frozenset(host)
    # a class only ever takes away: Tiger Lake as avx512 would be refused, never widened
    assert "avx512_bf16" not in cpu_class.capped_flags(TIGER_LAKE.split(), AVX512)


@pytest.mark.skipif(HOST not in CLASSES, reason="an x86-64 host of at least AVX2")
def test_under_avx2_the_engine_picks_float32_as_on_an_n100(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setenv(cpu_class.ENV, "avx2")
    assert not hardware.cpu_has_native_bf16() and not hardware.cpu_has_amx_bf16()
    assert hardware.pick_dtype(cpu, "auto") == torch.float32
    from hearth_engine.model.linear import can_pack_bf16

    assert not can_pack_bf16(cpu)  # no oneDNN-packed bf16 linears either
    assert not native.amx_wanted()
    if HOST in ("avx512", "amx"):
        monkeypatch.setenv(cpu_class.ENV, "avx512")  # Zen 4: bf16, but no AMX
        assert hardware.pick_dtype(cpu, "auto") == torch.bfloat16
        assert not hardware.cpu_has_amx_bf16() and not native.amx_wanted()


@pytest.mark.skipif(not below_host(), reason="the host runs no class below its own")
def test_each_class_builds_into_a_folder_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_class.ENV, raising=False)
    folders = {"native": native.build_dir()}
    for name in CLASSES:
        if name in below_host() or name == HOST:
            monkeypatch.setenv(cpu_class.ENV, name)
            folders[name] = native.build_dir()
    assert len(set(folders.values())) == len(folders), folders
    assert all(f.parent == folders["native"].parent for f in folders.values())


@pytest.mark.skipif(OWN != cpu_class.NATIVE, reason="the process already runs under a class")
@pytest.mark.skipif(not below_host(), reason="the host runs no class below its own")
def test_torch_capped_too_late_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's torch chose its kernels uncapped: a class set now would measure
    the host's torch under a smaller class's name, so the engine refuses to start."""
    torch.ones(2).exp()  # torch has chosen its kernels by now
    monkeypatch.setenv(cpu_class.ENV, below_host()[0])
    with pytest.raises(CpuClassError, match=r"torch already runs \w+ kernels; set it in the"):
        hardware.check_cpu_class()


# Instructions an AVX2 CPU does not have: AVX-512's registers (zmm, the masks k1-k7, the
# upper 16 vector registers) and EVEX-only operations on ymm/xmm (AVX512VL, BF16, VNNI).
EVEX = re.compile(
    r"%zmm|%k[1-7]\b|%[xy]mm(1[6-9]|2\d|3[01])\b"
    r"|\b(vpternlog[dq]|vperm[ti]2\w+|vdpbf16ps|vcvtne2ps2bf16|vpdpbusds?|vrndscale\w+)\b"
)
AMX_CODE = re.compile(r"\b(tdpbf16ps|tileloadd|tileloaddt1|ldtilecfg|tilezero)\b")


def test_this_process_runs_as_its_class() -> None:
    """Run plainly and in the reruns below: torch, the kernels and the flags the engine
    reads are all the class's, and the built file holds no instruction the class lacks."""
    chosen = cpu_class.selected()
    kernels = native.load()
    assert kernels is not None, native.error()
    code = built_code(Path(kernels.__file__))
    if chosen is None:
        assert "-march=native" in native.cflags() or "-mcpu=native" in native.cflags()
        if HOST in ("avx512", "amx"):  # the reading below finds what is there
            assert EVEX.search(code)
        if HOST == "amx":
            assert AMX_CODE.search(code)
        return
    assert hardware.check_cpu_class() is chosen  # torch took the cap
    assert torch.backends.cpu.get_cpu_capability() == chosen.aten.upper()
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == chosen.onednn
    assert Path(kernels.__file__).parent == native.build_dir()
    # the build's own paths: the bf16 prefix kernel needs AVX512-BF16, tiles need AMX
    assert kernels.prefix_attention_ready() is ("avx512_bf16" in chosen.flags)  # type: ignore[attr-defined]
    tiles = kernels.use_attention_amx(True)  # type: ignore[attr-defined]
    if "avx512f" not in chosen.flags:
        found = EVEX.search(code)
        assert found is None, f"{found.group(0)}: AVX-512 code in a build for a CPU without it"
    if "amx_tile" not in chosen.flags:
        assert tiles is False
        found = AMX_CODE.search(code)
        assert found is None, f"{found.group(0)}: AMX code in a build for a CPU without it"


def built_code(path: Path) -> str:
    """The module's machine code as text (``objdump -d``); skips without binutils."""
    if shutil.which("objdump") is None:
        pytest.skip("no objdump")
    done = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


KERNEL_TESTS = (
    "tests/engine/test_native.py",
    "tests/engine/test_quant_kernels.py",
    "tests/engine/test_tiled_linear.py",
    "tests/engine/test_native_step.py",
    "tests/engine/test_attention_amx.py",
    "tests/engine/test_cpu_class.py::test_this_process_runs_as_its_class",
)


@pytest.mark.skipif(OWN != cpu_class.NATIVE, reason="the process already runs under a class")
@pytest.mark.parametrize("name", list(CLASSES)[:-1])
@pytest.mark.timeout(1800)
def test_the_kernel_exactness_tests_pass_under_each_class_below_the_host(name: str) -> None:
    """The kernel tests again in a process of the class: its own build (a minute the
    first time, then cached), torch capped, the class's code paths."""
    if name not in below_host():
        pytest.skip(f"this host ({HOST}) runs {name} as its own class or not at all")
    env = {
        **os.environ,
        cpu_class.ENV: name,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "engine"), str(ROOT), str(ROOT / "bench")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *KERNEL_TESTS, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    summary = re.search(r"(\d+) passed", done.stdout)
    assert summary is not None and int(summary.group(1)) >= 60, tail


def get_json(server: ServerProcess, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{server.url}{path}", timeout=30) as response:
        return dict(json.loads(response.read()))


@pytest.mark.skipif(OWN != cpu_class.NATIVE, reason="the process already runs under a class")
@pytest.mark.skipif(HOST not in CLASSES, reason="an x86-64 host of at least AVX2")
@pytest.mark.timeout(1200)
def test_an_engine_run_as_avx2_builds_its_own_kernels_and_serves_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cpu_class.ENV, "avx2")
    folder = native.build_dir()
    monkeypatch.delenv(cpu_class.ENV)
    assert folder != native.build_dir()
    monkeypatch.setenv(cpu_class.ENV, "avx2")
    server = launch_server(tmp_path, "--model", "tiny", "--dtype", "auto")
    try:
        stats = get_json(server, "/v1/stats")
        deadline = time.monotonic() + 900  # a cold build on a busy 2-core machine
        while stats["native_attention"] == "building" and time.monotonic() < deadline:
            time.sleep(2)
            stats = get_json(server, "/v1/stats")
        assert stats["native_attention"] == "active", server.stderr()[-3000:]
        assert stats["dtype"] == "float32"
        assert stats["cpu_class"] == "avx2"
        assert stats["cpu_class_emulated"] is (HOST != "avx2")
        assert stats["cpu_host_class"] == HOST
        assert f"CPU class: {cpu_class.describe(AVX2)}" in server.stderr()
        assert any(folder.glob(f"{native.NAME}*.so")), folder
        body = json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        ).encode()
        request = urllib.request.Request(
            f"{server.url}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.loads(response.read())
        assert reply["usage"]["completion_tokens"] >= 1
    finally:
        assert server.stop() == 0

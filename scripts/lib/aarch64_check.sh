#!/usr/bin/env bash
# The engine's C++ kernels on aarch64, under emulation (docs/development.md, "aarch64"):
# cross-compiles them with aarch64-linux-gnu-g++ against an aarch64 torch wheel, then runs
# the kernel exactness tests in an aarch64 Python 3.11 under qemu-aarch64-static.
#
#   scripts/lib/aarch64_check.sh [PYTEST OPTIONS...]   the kernel tests (TESTS, below)
#   scripts/lib/aarch64_check.sh TEST_PATH... [OPTIONS]   those tests instead
#
# Needs: apt-get install -y g++-aarch64-linux-gnu qemu-user-static, and the engine venv.
# Everything else is cached under ~/.cache/hearth/aarch64, keyed by its inputs:
#   sysroot-KEY  Debian arm64 python3.11 and its libraries (the machine's own archive),
#   site-KEY     the aarch64 torch wheel and the tests' packages (the venv's versions),
#   build-KEY    hearth_native.so (sources, flags, torch and compiler in the key).
# Settings: HEARTH_AARCH64_MARCH (default armv8-a: the oldest cores HA runs on, a Pi 4's
# and HA Yellow's Cortex-A72; armv8.2-a+dotprod for HA Green's A55 and a Pi 5's A76),
# HEARTH_AARCH64_TORCH (default: the newest CPU-only aarch64 torch <= the venv's).
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/apt_sources.sh"

BASE="$HEARTH_CACHE/aarch64"
CXX_A64=aarch64-linux-gnu-g++
QEMU=qemu-aarch64-static
MARCH=${HEARTH_AARCH64_MARCH:-armv8-a}
KERNELS="$ROOT/engine/hearth_engine/model/kernels"
PY="$ENGINE_VENV/bin/python"
PACKAGES=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3.11 libpython3.11-dev
  libc6 libstdc++6 libgcc-s1 libgomp1 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5
  libsqlite3-0 libuuid1 libncursesw6 libtinfo6 libreadline8 libdb5.3 libcrypt1 libnsl2 libtirpc3
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1 media-types)
# The tests that check the kernels against torch or float64 (tests/engine): all of them
# but those of the build's own mechanics (locks, a missing compiler), which build on the
# host and are the same Python on every machine.
TESTS=(tests/engine/test_native.py tests/engine/test_quant_kernels.py
  tests/engine/test_tiled_linear.py tests/engine/test_native_step.py)
DESELECT="not killed_build and not build_held_elsewhere and not without_a_compiler"
PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64
  --platform manylinux_2_17_aarch64 --platform linux_aarch64)

key_of() { printf '%s\n' "$@" | sha256sum | cut -c1-12; }

check_tools() {
  local missing=()
  for tool in "$CXX_A64" "$QEMU" apt-get dpkg-deb; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) ||
    die "missing ${missing[*]}: apt-get install -y g++-aarch64-linux-gnu qemu-user-static"
  [[ -x "$PY" ]] || die "no engine venv at $ENGINE_VENV (scripts/setup)"
}

# Debian arm64 packages of this machine's own release, from its own archive (apt sources
# with only the architecture changed), unpacked into a private root; nothing is installed.
make_sysroot() {
  local root=$1 apt="$BASE/apt" codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  mkdir -p "$apt/lists/partial" "$apt/sources.list.d" "$apt/cache" "$root.tmp/debs"
  : >"$apt/sources.list"
  : >"$apt/status"
  apt_sources_for_suite "$codename" "$codename" >"$apt/sources.list.d/arm64.sources"
  [[ -s "$apt/sources.list.d/arm64.sources" ]] || die "no apt source for $codename in /etc/apt"
  local O=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o "Dir::Etc::sourceparts=$apt/sources.list.d"
    -o "Dir::State::Lists=$apt/lists" -o "Dir::State::status=$apt/status" -o "Dir::Cache=$apt/cache"
    -o "APT::Get::List-Cleanup=0" -o "APT::Architecture=arm64" -o "APT::Architectures::=arm64")
  apt-get "${O[@]}" -qq update 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
  (cd "$root.tmp/debs" && apt-get "${O[@]}" -qq download "${PACKAGES[@]}" 2>&1 |
    grep -v "^W: Download is performed unsandboxed" || true)
  for deb in "$root.tmp/debs"/*.deb; do dpkg-deb -x "$deb" "$root.tmp"; done
  rm -rf "$root.tmp/debs"
  local inc="$root.tmp/usr/include"
  cp --remove-destination "$inc/aarch64-linux-gnu/python3.11/pyconfig.h" "$inc/python3.11/pyconfig.h"
  rm -rf "$root" && mv "$root.tmp" "$root"
  write_wrapper "$root"
  "$root/usr/bin/python3.11-emulated" -c 'import platform; assert platform.machine() == "aarch64"'
}

# python3.11-emulated, the interpreter the tests see as sys.executable: a child Python
# (subprocess tests) starts under qemu too, as binfmt_misc may not be there to do it. It
# sits beside python3.11, so the stdlib is found, and puts $HEARTH_AARCH64_SITE (the
# aarch64 packages) last on the path, as a venv's site-packages would be, so a child whose
# PYTHONPATH names only the engine still finds torch.
write_wrapper() {
  local root=$1
  cat >"$root/usr/bin/python3.11-emulated" <<WRAPPER
#!/bin/sh
[ -n "\$HEARTH_AARCH64_SITE" ] && export PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}\$HEARTH_AARCH64_SITE"
exec $QEMU -L "$root" -0 "\$0" "$root/usr/bin/python3.11" "\$@"
WRAPPER
  chmod +x "$root/usr/bin/python3.11-emulated"
}

# The aarch64 torch wheel and the tests' packages, at the engine venv's versions.
make_site() {
  local site=$1 torch=$2 pins=$3 wheels="$BASE/wheels"
  mkdir -p "$wheels"
  printf 'torch==%s\n%s\n' "$torch" "$pins" >"$BASE/requirements.txt"
  "$PY" -m pip download -q --no-deps --only-binary=:all: "${PLATFORMS[@]}" --python-version 3.11 \
    -r "$BASE/requirements.txt" -d "$wheels" 2>&1 | grep -v "is ignored" || true
  rm -rf "$site.tmp"
  "$PY" -m pip install -q --no-deps --no-index --find-links "$wheels" --only-binary=:all: \
    "${PLATFORMS[@]}" --python-version 3.11 --target "$site.tmp" -r "$BASE/requirements.txt"
  rm -rf "$site" && mv "$site.tmp" "$site"
  # an older key's site (a gigabyte) is not kept; wheels stay, for the next one
  find "$BASE" -maxdepth 1 -name 'site-*' ! -name "${site##*/}" -exec rm -rf {} +
}

# The build: cpp_extension's defines and the flags native.py gives an aarch64 host, with
# -mcpu=native (a cross compiler has no host CPU to look at) replaced by -march=$MARCH.
build_kernels() {
  local out=$1 site=$2 root=$3 std=$4 abi=$5 flags
  flags=$(PYTHONPATH="$ROOT/engine" "$PY" -c \
    'from hearth_engine.model.native import compile_flags; print(" ".join(compile_flags("aarch64")))')
  flags=${flags/-mcpu=native/-march=$MARCH}
  local cflags="-DTORCH_EXTENSION_NAME=hearth_native -DTORCH_API_INCLUDE_EXTENSION_H
    -D_GLIBCXX_USE_CXX11_ABI=$abi -isystem $site/torch/include
    -isystem $site/torch/include/torch/csrc/api/include -isystem $root/usr/include/python3.11
    -fPIC -std=$std $flags"
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  local sources=(module decode_attention prefix_attention decode_linear quant_linear layer_ops decode_step)
  # shellcheck disable=SC2086  # cflags is a word list
  printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} sh -c \
    "$CXX_A64 $(echo $cflags) -c '$KERNELS/{}.cpp' -o '$out.tmp/{}.o' || exit 255" ||
    die "the kernels did not compile for aarch64 (-march=$MARCH): the compiler's messages are above"
  "$CXX_A64" "$out.tmp"/*.o -shared -fopenmp -L"$site/torch/lib" -lc10 -ltorch_cpu -ltorch \
    -ltorch_python -o "$out.tmp/hearth_native.so"
  echo "$cflags" | tr -s ' \n' ' ' >"$out.tmp/flags.txt"
  rm -f "$out.tmp"/*.o && rm -rf "$out" && mv "$out.tmp" "$out"
}

main() {
  check_tools
  mkdir -p "$BASE"
  local t0=$SECONDS codename root site build torch pins std abi
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")

  root="$BASE/sysroot-$(key_of "$codename" "${PACKAGES[@]}" "$(cat /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list 2>/dev/null)")"
  [[ -x "$root/usr/bin/python3.11" ]] ||
    step "an arm64 Python 3.11 root under $root (Debian packages)" "10-30 s" make_sysroot "$root"
  write_wrapper "$root"

  local venv_torch
  venv_torch=$("$PY" -c 'from importlib.metadata import version; print(version("torch"))')
  torch=${HEARTH_AARCH64_TORCH:-}
  if [[ -z "$torch" ]]; then
    local choice="$BASE/torch-for-$venv_torch"
    [[ -s "$choice" ]] || step "finding the newest CPU-only aarch64 torch <= $venv_torch" "1-2 min" \
      sh -c "'$PY' '$ROOT/scripts/lib/aarch64_torch.py' torch '$venv_torch' >'$choice.tmp' && mv '$choice.tmp' '$choice'"
    torch=$(cat "$choice")
  fi
  pins=$("$PY" "$ROOT/scripts/lib/aarch64_torch.py" pins)
  site="$BASE/site-$(key_of "$torch" "$pins")"
  [[ -f "$site/torch/__init__.py" ]] ||
    step "aarch64 torch $torch and the tests' packages into $site" "1-3 min" \
      make_site "$site" "$torch" "$pins"

  # The C++ standard torch's cpp_extension builds with (c++17 up to 2.12, c++20 after), and
  # the wheel's libstdc++ ABI (asked of torch itself, under emulation: 20-60 s once).
  std=$(sed -n "s/.*cflags = common_cflags + \['-fPIC', '-std=\(c++[0-9]*\)'\].*/\1/p" \
    "$site/torch/utils/cpp_extension.py" | head -1)
  std=${std:-c++17}
  [[ -s "$site/abi.txt" ]] || step "asking the aarch64 torch its C++ ABI (emulated)" "20-60 s" \
    sh -c "HEARTH_AARCH64_SITE='$site' '$root/usr/bin/python3.11-emulated' -c \
      'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' >'$site/abi.txt'"
  abi=$(cat "$site/abi.txt")

  build="$BASE/build-$(key_of "$torch" "$std" "$abi" "$MARCH" "$("$CXX_A64" --version | head -1)" \
    "$(cat "$KERNELS"/*.cpp "$KERNELS"/*.h "$ROOT/engine/hearth_engine/model/native.py" | sha256sum)")"
  [[ -f "$build/hearth_native.so" ]] ||
    step "cross-compiling the kernels for aarch64 (-march=$MARCH, $std, torch $torch)" "3-6 min" \
      build_kernels "$build" "$site" "$root" "$std" "$abi"
  log "built: $build/hearth_native.so ($(cat "$build/flags.txt"))"

  # pytest options are added to the default tests; a test path replaces them
  local args=("$@") arg
  for arg in "$@"; do [[ -e "$ROOT/${arg%%::*}" ]] && { set -- ; break; }; done
  (($#)) && args=("${TESTS[@]}" -k "$DESELECT" "$@")
  ((${#args[@]})) || args=("${TESTS[@]}" -k "$DESELECT")
  log "pytest ${args[*]} under qemu (aarch64, torch $torch): minutes"
  cd "$ROOT"
  HEARTH_NATIVE_MODULE="$build/hearth_native.so" HEARTH_AARCH64_SITE="$site" \
    PYTHONPATH="$ROOT/engine:$ROOT:$ROOT/bench" \
    "$root/usr/bin/python3.11-emulated" -m pytest -p no:cacheprovider "${args[@]}"
  log "aarch64 check done in $((SECONDS - t0)) s"
}

main "$@"

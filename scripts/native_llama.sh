#!/usr/bin/env bash
# Builds a native llama.cpp to compare Tern against: llama-bench,
# llama-perplexity and llama-server, with llama.cpp's own CMake, a Release
# build and GGML_NATIVE=ON (every instruction set this CPU has, AVX-512 and
# VNNI included where present).
#
# The sources come from a package manager, never a git host: the llama.cpp
# tree vendored in the llama-cpp-python sdist (pip download --no-binary),
# which carries the tools. The llama-cpp-sys-2 crate that Tern is bit-exact
# with vendors only the libraries (its tools/ holds READMEs), so this is a
# nearby llama.cpp version (llama-cpp-python's CHANGELOG names the commit);
# speed, not bits, is what the native build is for. BUILD.txt records both.
#
# Output: target/llama-native/bin/{llama-bench,llama-perplexity,llama-server}
# and target/llama-native/BUILD.txt (versions, flags, the CPU's instruction
# sets). Reruns skip what is built; --clean starts over.
#
#   scripts/native_llama.sh            # build (about 10 minutes on 2 cores)
#   scripts/native_llama.sh --print    # print the bin directory and exit
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="$ROOT/target/llama-native"
BIN="$OUT/bin"
LCP_VERSION=0.3.36
JOBS=${JOBS:-$(nproc)}

if [[ "${1:-}" == "--print" ]]; then
    echo "$BIN"
    exit 0
fi
if [[ "${1:-}" == "--clean" ]]; then
    rm -rf "$OUT"
fi
command -v cmake >/dev/null || { echo "native_llama.sh: cmake is missing (apt-get install cmake)" >&2; exit 1; }
mkdir -p "$BIN" "$OUT/src"

# The crate's version, as Cargo.lock pins it (for BUILD.txt).
SYS_VERSION=$(awk '/^name = "llama-cpp-sys-2"/{getline; gsub(/"/,"",$3); print $3}' "$ROOT/Cargo.lock")

COMMON_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_SERVER=ON
)
# AMX stays off unless NATIVE_AMX=1: with it, ggml's AMX matmul
# (ggml_backend_amx_mul_mat) died of SIGSEGV on the first prompt of every
# model tried on this project's machine (SmolLM2 Q4_1, Qwen2.5-Coder Q4_K_M).
# AVX-512, VNNI and BF16 stay on.
if [[ "${NATIVE_AMX:-0}" != 1 ]]; then
    NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    COMMON_FLAGS+=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
fi

SDIST="$OUT/src/llama_cpp_python-$LCP_VERSION"
TREE="$SDIST/vendor/llama.cpp"
if [[ ! -d "$TREE/tools/server" ]]; then
    echo "fetching the llama-cpp-python $LCP_VERSION sdist (pip download --no-binary)"
    python3 -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$LCP_VERSION" -d "$OUT/src"
    tar xzf "$OUT/src/llama_cpp_python-$LCP_VERSION.tar.gz" -C "$OUT/src"
fi
TARGETS=(llama-bench llama-perplexity llama-server)
missing=0
for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || missing=1; done
# Flags changed since the last build: build again.
[[ "$(cat "$OUT/flags" 2>/dev/null)" == "${COMMON_FLAGS[*]}" ]] || missing=1
if [[ $missing == 1 ]]; then
    echo "building ${TARGETS[*]} from llama-cpp-python $LCP_VERSION's llama.cpp (Release, GGML_NATIVE=ON, -j $JOBS)"
    cmake -S "$TREE" -B "$OUT/build" "${COMMON_FLAGS[@]}" >"$OUT/configure.log" 2>&1 ||
        { tail -20 "$OUT/configure.log" >&2; exit 1; }
    cmake --build "$OUT/build" --target "${TARGETS[@]}" -j "$JOBS" >"$OUT/build.log" 2>&1 ||
        { tail -30 "$OUT/build.log" >&2; exit 1; }
    for t in "${TARGETS[@]}"; do cp "$OUT/build/bin/$t" "$BIN/"; done
    echo "${COMMON_FLAGS[*]}" >"$OUT/flags"
fi

# What was built, on what.
{
    echo "llama.cpp: the tree vendored in llama-cpp-python $LCP_VERSION (sdist), $(grep -m1 -o 'llama.cpp@[0-9a-f]*' "$SDIST/CHANGELOG.md")"
    echo "Tern's in-process reference: llama-cpp-sys-2 $SYS_VERSION (a different llama.cpp version)"
    echo "cmake flags: ${COMMON_FLAGS[*]}"
    echo "compiler: $(${CC:-cc} --version | head -1)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "instruction sets: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -E '^(avx|avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512dq|avx512_vnni|avx512_bf16|avx_vnni|amx_tile)$' |
        tr '\n' ' ')"
} >"$OUT/BUILD.txt"
cat "$OUT/BUILD.txt"
echo "built: $BIN"

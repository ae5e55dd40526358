#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the sources vendored in the installed llama-cpp-python's
# sdist (same llama.cpp revision as the service uses), once; later runs reuse the cached binary.
#   benchmarks/build_llama_server.sh            → prints the path of the binary
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${LMSP_BENCH_CACHE:-$ROOT/.bench-cache}
PY=${PYTHON:-$ROOT/.venv/bin/python}
VERSION=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')
OUT="$CACHE/llama-server-$VERSION"
if [ -x "$OUT/bin/llama-server" ]; then echo "$OUT/bin/llama-server"; exit 0; fi
mkdir -p "$CACHE"
SRC="$CACHE/llama-cpp-python-$VERSION"
if [ ! -d "$SRC" ]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/sdist" >&2
  tar -xzf "$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"
  mv "$CACHE/llama_cpp_python-$VERSION" "$SRC"
fi
cmake -S "$SRC/vendor/llama.cpp" -B "$SRC/build-server" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$SRC/build-server" --target llama-server -j "$(nproc)" >&2
mkdir -p "$OUT/bin"
cp "$SRC/build-server/bin/llama-server" "$OUT/bin/"
echo "$OUT/bin/llama-server"

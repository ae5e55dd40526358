#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the sources vendored in the installed llama-cpp-python's
# sdist (same llama.cpp revision as the service uses), once; later runs reuse the cached binary.
#   benchmarks/build_llama_server.sh            → prints the path of the binary (static build)
#   benchmarks/build_llama_server.sh shared     → the same sources built as llama.cpp builds by
#                                                 default (BUILD_SHARED_LIBS=ON: libllama.so,
#                                                 libggml*.so), as its release archives and
#                                                 llama-cpp-python's own libraries are
#   benchmarks/build_llama_server.sh static vulkan   → built for a GPU backend (cpu|vulkan|cuda|metal),
#                                                 cached per backend; LLAMA_SERVER_CMAKE_ARGS adds
#                                                 CMake arguments (e.g. -DVulkan_INCLUDE_DIR=...)
set -euo pipefail
LINK=${1:-static}
BACKEND=${2:-cpu}
case "$BACKEND" in
  cpu) GPU_ARGS=""; BSUFFIX="" ;;
  vulkan|cuda|metal) GPU_ARGS="-DGGML_$(echo "$BACKEND" | tr a-z A-Z)=ON"; BSUFFIX="-$BACKEND" ;;
  *) echo "unknown backend $BACKEND (cpu|vulkan|cuda|metal)" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${LMSP_BENCH_CACHE:-$ROOT/.bench-cache}
PY=${PYTHON:-$ROOT/.venv/bin/python}
VERSION=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')
if [ "$LINK" = shared ]; then SUFFIX=-shared; SHARED=ON; else SUFFIX=; SHARED=OFF; fi
OUT="$CACHE/llama-server-$VERSION$SUFFIX$BSUFFIX"
mkdir -p "$CACHE"
SRC="$CACHE/llama-cpp-python-$VERSION"
if [ ! -d "$SRC" ]; then  # unpacked even where the binary is cached: tests read llama.cpp's own test files
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/sdist" >&2
  tar -xzf "$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"
  mv "$CACHE/llama_cpp_python-$VERSION" "$SRC"
fi
if [ -x "$OUT/bin/llama-server" ]; then echo "$OUT/bin/llama-server"; exit 0; fi
BUILD="$SRC/build-server$SUFFIX$BSUFFIX"
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=$SHARED \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' $GPU_ARGS ${LLAMA_SERVER_CMAKE_ARGS:-} >&2
cmake --build "$BUILD" --target llama-server -j "$(nproc)" >&2
mkdir -p "$OUT/bin"
cp "$BUILD/bin/llama-server" "$OUT/bin/"
if [ "$SHARED" = ON ]; then cp -P "$BUILD"/bin/*.so* "$OUT/bin/"; fi
echo "$OUT/bin/llama-server"

#!/usr/bin/env bash
# Build the real llama.cpp servers the tests in tests/real/ start, from PyPI's source package only:
#   - llama-cpp-python's server (a wheel built once, then installed into the active environment);
#   - llama.cpp's own `llama-server`, built with cmake from the same source package's vendor/llama.cpp.
# Builds are cached outside the clone, keyed by version, so a second run only installs.
# Prints the llama-server path on its last line. Exits non-zero if anything fails.
set -euo pipefail
VERSION="${SPECAPI_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${SPECAPI_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specapi/llama-cpp-python-$VERSION}"
mkdir -p "$CACHE/wheels" "$CACHE/sdist"
JOBS="$(nproc 2>/dev/null || echo 2)"
# One build at a time (a test session and CI, say): a second caller waits, then finds the cache.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE/.lock"
  flock 9
fi

if ! ls "$CACHE"/wheels/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $VERSION wheel (a few minutes, once)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    python -m pip wheel --quiet --no-deps --no-binary llama-cpp-python \
      -w "$CACHE/wheels" "llama-cpp-python==$VERSION" >&2
fi
python -m pip install --quiet "$CACHE"/wheels/llama_cpp_python-"$VERSION"-*.whl >&2
python -m pip install --quiet "llama-cpp-python[server]==$VERSION" --find-links "$CACHE/wheels" >&2

SERVER="$CACHE/bin/llama-server"
if [ ! -x "$SERVER" ]; then
  echo "building llama-server from llama-cpp-python $VERSION's vendor/llama.cpp (a few minutes, once)" >&2
  rm -rf "$CACHE/sdist"/* "$CACHE/build"
  python -m pip download --quiet --no-deps --no-binary :all: -d "$CACHE/sdist" "llama-cpp-python==$VERSION" >&2
  tar -xzf "$CACHE"/sdist/llama_cpp_python-"$VERSION".tar.gz -C "$CACHE/sdist"
  SRC="$CACHE/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp"
  cmake -S "$SRC" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$CACHE/build" --target llama-server -j "$JOBS" >&2
  mkdir -p "$CACHE/bin"
  cp "$CACHE/build/bin/llama-server" "$SERVER"
  rm -rf "$CACHE/build" "$CACHE/sdist"/*
fi
"$SERVER" --version >&2 || true
echo "$SERVER"

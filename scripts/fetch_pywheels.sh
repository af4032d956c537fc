#!/usr/bin/env bash
# Downloads, pinned, the wheels of transformers and compressed-tensors and of what they need at
# import and run time, except torch and numpy, into .pywheels/ (git-ignored), for the GPU machine
# (CPython 3.12, manylinux x86_64, torch installed, no network): carried with the checkout, they
# let tests/python/test_nn.py's model tests and bench/bench_nn.py run there (docs/nn.md).
#
#   bash scripts/fetch_pywheels.sh           # run on the developer machine (needs PyPI)
#
# On the GPU machine:
#   python3 -m pip install --no-index --no-deps --target /tmp/tfsite .pywheels/*.whl
#   PYTHONPATH=/tmp/tfsite python3 -m pytest -q tests/python/test_nn.py
#
# Left out, not needed to build models from a config and run them: torch and numpy (there
# already), tokenizers, hf-xet (downloads), and the command-line packages of transformers and
# huggingface-hub (typer, click, rich, pygments, markdown-it-py, mdurl, shellingham,
# annotated-doc). The versions are those the real-client tests run with (scripts/lib/client_deps.sh).
# Environment: PYTHON (default python3), LOWBIT_PYWHEELS_DIR (default .pywheels),
# PYWHEELS_PYTHON_VERSION (default 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
dest=${LOWBIT_PYWHEELS_DIR:-.pywheels}
pyver=${PYWHEELS_PYTHON_VERSION:-3.12}
source scripts/lib/client_deps.sh
pins=(
  "transformers==$LOWBIT_TRANSFORMERS_VERSION" "compressed-tensors==$LOWBIT_COMPRESSED_TENSORS_VERSION"
  huggingface-hub==2.4.0 safetensors==0.8.0 regex==2026.11.19 pyyaml==6.0.4 tqdm==4.70.1 packaging==26.4
  filelock==4.3.1 fsspec==2026.9.0 typing-extensions==4.16.0
  httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0 idna==3.20 truststore==0.10.5
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 loguru==0.7.3
  psutil==7.2.2
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== downloading ${#pins[@]} wheels for CPython $pyver, manylinux2014 x86_64 (no dependencies)"
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" \
  --platform manylinux2014_x86_64 --dest "$tmp" "${pins[@]}"
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp"/*.whl "$dest"/
echo "$(ls "$dest"/*.whl | wc -l) wheels in $dest: $(du -sh "$dest" | cut -f1)"
echo "on the GPU machine: python3 -m pip install --no-index --no-deps --target /tmp/tfsite $dest/*.whl"

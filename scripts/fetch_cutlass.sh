#!/usr/bin/env bash
# Copies the pinned CUTLASS / CuTe C++ headers into .deps/cutlass (git-ignored), for machines
# that cannot reach a package registry: the GPU machine gets the folder carried with the checkout
# and CMake finds it there (or pass -DLOWBIT_CUTLASS_DIR=$PWD/.deps/cutlass).
#
#   bash scripts/fetch_cutlass.sh            # run on the developer machine (needs PyPI)
#
# Source: the PyPI wheel nvidia-cutlass==4.2.0.0 (downloaded without its dependencies into a
# temporary folder); only headers are kept:
#   cutlass_library/source/include             -> .deps/cutlass/include            (cute/, cutlass/)
#   cutlass_library/source/tools/util/include  -> .deps/cutlass/tools/util/include
# Environment: CUTLASS_VERSION (default 4.2.0.0), LOWBIT_DEPS_DIR (default .deps/cutlass),
# PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${CUTLASS_VERSION:-4.2.0.0}
dest=${LOWBIT_DEPS_DIR:-.deps/cutlass}
py=${PYTHON:-python3}

if [ -f "$dest/include/cute/tensor.hpp" ] && [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$version" ]; then
  echo "CUTLASS $version headers already in $dest ($(du -sh "$dest" | cut -f1))"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== downloading nvidia-cutlass==$version (no dependencies)"
"$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "nvidia-cutlass==$version"
wheel=$(ls "$tmp"/nvidia_cutlass-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
  echo "error: no nvidia_cutlass wheel was downloaded into $tmp" >&2
  exit 1
fi

echo "== extracting headers from $(basename "$wheel")"
"$py" - "$wheel" "$tmp/x" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefixes = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefixes) and not n.endswith("/")]
    if not names:
        sys.exit("error: the wheel holds no cutlass_library/source/include headers")
    for n in names:
        z.extract(n, out)
print(f"{len(names)} files")
EOF

src="$tmp/x/cutlass_library/source"
[ -f "$src/include/cute/tensor.hpp" ] || { echo "error: cute/tensor.hpp missing from the wheel" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/tools/util"
cp -r "$src/include" "$dest/include"
cp -r "$src/tools/util/include" "$dest/tools/util/include"
echo "$version" > "$dest/VERSION"
echo "CUTLASS $version headers in $dest: $(du -sh "$dest" | cut -f1) ($(find "$dest" -type f | wc -l) files)"
echo "use: cmake -DLOWBIT_CUTLASS_DIR=$(pwd)/$dest ...   (CMake also finds $dest by itself)"

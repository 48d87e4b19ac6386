#!/usr/bin/env bash
# Installs Triton's perf_analyzer into tools/ for `gebackend bench` (run by `make tools`).
#
# perf_analyzer ships as a binary inside the tritonclient==2.41.0 manylinux wheel; the wheel is only
# downloaded and unpacked here (the product never imports that old tritonclient). The binary needs
# libb64.so.0d (Debian's libb64-0d) and a libcudart.so.12 even on a CPU-only machine: the CUDA runtime
# bundled in nvidia-pytriton is linked into tools/lib, and the bench runs it with LD_LIBRARY_PATH=tools/lib.
#
#   tools/install_perf_analyzer.sh [PYTHON]     (default: .venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/tools"
PY="${1:-$ROOT/.venv/bin/python}"
VERSION=2.41.0
BIN="$TOOLS/bin/perf_analyzer"

mkdir -p "$TOOLS/bin" "$TOOLS/lib" "$TOOLS/wheels"

if [ ! -x "$BIN" ]; then
    wheel="$(ls "$TOOLS"/wheels/tritonclient-$VERSION-*manylinux*x86_64.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux1_x86_64 --python-version 3.11 \
            "tritonclient==$VERSION" -d "$TOOLS/wheels"
        wheel="$(ls "$TOOLS"/wheels/tritonclient-$VERSION-*manylinux*x86_64.whl | head -n1)"
    fi
    "$PY" - "$wheel" "$BIN" <<'PYEOF'
import shutil, sys, zipfile
wheel, target = sys.argv[1], sys.argv[2]
member = "tritonclient-2.41.0.data/data/bin/perf_analyzer"
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(target + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst)
PYEOF
    chmod +x "$BIN.tmp"
    mv "$BIN.tmp" "$BIN"
fi

# libb64.so.0d: Debian's package where apt can install it, else the copy nvidia-pytriton bundles.
if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get install -y -qq libb64-0d >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libb64-0d >/dev/null 2>&1; } \
            || echo "install_perf_analyzer: apt-get install libb64-0d failed; using nvidia-pytriton's copy" >&2
    fi
fi

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
LIBS="$SITE/nvidia_pytriton.libs"
cudart="$(ls "$LIBS"/libcudart-*.so.12* 2>/dev/null | head -n1 || true)"
if [ -z "$cudart" ]; then
    echo "install_perf_analyzer: no libcudart-*.so.12* in $LIBS (is nvidia-pytriton installed in $PY's environment?)" >&2
    exit 1
fi
ln -sfn "$cudart" "$TOOLS/lib/libcudart.so.12"
if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
    b64="$(ls "$LIBS"/libb64-*.so.0d 2>/dev/null | head -n1 || true)"
    [ -n "$b64" ] && ln -sfn "$b64" "$TOOLS/lib/libb64.so.0d"
fi

if ! LD_LIBRARY_PATH="$TOOLS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BIN" --help >/dev/null 2>&1; then
    # --help exits non-zero on some versions; a missing library shows up in ldd instead.
    missing="$(LD_LIBRARY_PATH="$TOOLS/lib" ldd "$BIN" | grep 'not found' || true)"
    if [ -n "$missing" ]; then
        echo "install_perf_analyzer: $BIN cannot start:" >&2
        echo "$missing" >&2
        exit 1
    fi
fi
echo "perf_analyzer installed: $BIN (run with LD_LIBRARY_PATH=$TOOLS/lib)"

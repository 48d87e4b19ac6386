#!/usr/bin/env bash
# Builds the peer for `gebackend bench/tune --peer-backend-dir`: Triton's own C++ onnxruntime backend, CPU only,
# from triton-inference-server/onnxruntime_backend at r24.10 (the release of the tritonserver 2.51 that
# nvidia-pytriton ships), against the ONNX Runtime library of the pinned onnxruntime wheel in .venv, so the peer and
# `ge` run the same ONNX Runtime on the same server binary. Nothing it builds is part of this project: the output
# folder (default ./peer-backend, git-ignored) is only measured against. `make peer` runs it.
#
#   tools/build_peer_backend.sh [--out DIR] [--src DIR] [--ort-include DIR] [--python PY]
#
#   --out DIR          where the backends folder goes: DIR/onnxruntime/libtriton_onnxruntime.so (default peer-backend)
#   --src DIR          a folder with checkouts onnxruntime_backend, backend, core and common at r24.10 (default:
#                      cloned from GitHub into DIR/src, which needs the network)
#   --ort-include DIR  a folder holding ONNX Runtime's onnxruntime_c_api.h (and the headers it includes) of any
#                      version up to the wheel's; the C API is versioned, so an older header runs on the newer
#                      library (default: ONNX Runtime's include/onnxruntime/core/session at the wheel's version,
#                      sparse-cloned from GitHub)
#   --python PY        the interpreter whose onnxruntime wheel provides libonnxruntime.so (default .venv/bin/python)
#
# Needs cmake, g++, git and Debian's rapidjson-dev and googletest (the common repo's tests are configured, not built).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/peer-backend"
SRC=""
ORT_INCLUDE=""
PY="$ROOT/.venv/bin/python"
RELEASE=r24.10
GITHUB=https://github.com

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$(realpath -m "$2")"; shift 2 ;;
        --src) SRC="$(realpath "$2")"; shift 2 ;;
        --ort-include) ORT_INCLUDE="$(realpath "$2")"; shift 2 ;;
        --python) PY="$2"; shift 2 ;;
        *) echo "build_peer_backend: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
    esac
done

for tool in cmake g++ git; do
    command -v "$tool" >/dev/null || { echo "build_peer_backend: $tool is not installed" >&2; exit 1; }
done
[ -d /usr/include/rapidjson ] || { echo "build_peer_backend: rapidjson is missing: apt-get install rapidjson-dev" >&2; exit 1; }
[ -d /usr/src/googletest ] || { echo "build_peer_backend: googletest is missing: apt-get install googletest" >&2; exit 1; }

ORT_LIB="$("$PY" -c 'import glob, os, onnxruntime; d = os.path.join(os.path.dirname(onnxruntime.__file__), "capi"); print(sorted(glob.glob(os.path.join(d, "libonnxruntime.so.*")))[-1])')"
ORT_VERSION="$("$PY" -c 'import onnxruntime; print(onnxruntime.__version__)')"
echo "build_peer_backend: ONNX Runtime $ORT_VERSION from $ORT_LIB"

WORK="$OUT/build"
mkdir -p "$WORK"
if [ -z "$SRC" ]; then
    SRC="$OUT/src"
    for repo in onnxruntime_backend backend core common; do
        [ -d "$SRC/$repo" ] || git clone --quiet --depth 1 -b "$RELEASE" "$GITHUB/triton-inference-server/$repo.git" "$SRC/$repo"
    done
fi
for repo in onnxruntime_backend backend core common; do
    [ -f "$SRC/$repo/CMakeLists.txt" ] || { echo "build_peer_backend: $SRC/$repo is not a checkout of $repo" >&2; exit 1; }
done
if [ -z "$ORT_INCLUDE" ]; then
    ORT_INCLUDE="$OUT/ort-include"
    if [ ! -f "$ORT_INCLUDE/onnxruntime_c_api.h" ]; then
        tmp="$OUT/ort-src"
        rm -rf "$tmp"
        git clone --quiet --depth 1 --filter=blob:none --sparse -b "v$ORT_VERSION" "$GITHUB/microsoft/onnxruntime.git" "$tmp"
        git -C "$tmp" sparse-checkout set include/onnxruntime/core/session
        mkdir -p "$ORT_INCLUDE"
        cp "$tmp"/include/onnxruntime/core/session/*.h "$ORT_INCLUDE/"
    fi
fi
[ -f "$ORT_INCLUDE/onnxruntime_c_api.h" ] || { echo "build_peer_backend: no onnxruntime_c_api.h in $ORT_INCLUDE" >&2; exit 1; }

# The backend links -lonnxruntime and loads libonnxruntime.so.1 from its own folder ($ORIGIN).
BACKEND="$OUT/onnxruntime"
mkdir -p "$BACKEND"
cp "$ORT_LIB" "$BACKEND/"
ln -sf "$(basename "$ORT_LIB")" "$BACKEND/libonnxruntime.so.1"
ln -sf libonnxruntime.so.1 "$BACKEND/libonnxruntime.so"

cmake -S "$SRC/onnxruntime_backend" -B "$WORK" -DCMAKE_BUILD_TYPE=Release \
    -DTRITON_ENABLE_GPU=OFF -DTRITON_ENABLE_ONNXRUNTIME_OPENVINO=OFF -DTRITON_ENABLE_ONNXRUNTIME_TENSORRT=OFF \
    -DTRITON_ONNXRUNTIME_INCLUDE_PATHS="$ORT_INCLUDE" -DTRITON_ONNXRUNTIME_LIB_PATHS="$BACKEND" \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$SRC/common" -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$SRC/core" \
    -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$SRC/backend" -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest \
    > "$WORK/cmake.log" 2>&1 || { tail -30 "$WORK/cmake.log" >&2; exit 1; }
cmake --build "$WORK" --target triton-onnxruntime-backend -j "$(nproc)" > "$WORK/build.log" 2>&1 \
    || { grep -m 20 -i error "$WORK/build.log" >&2; exit 1; }
cp "$WORK/libtriton_onnxruntime.so" "$BACKEND/"
echo "build_peer_backend: $BACKEND/libtriton_onnxruntime.so (Triton onnxruntime_backend $RELEASE, ONNX Runtime $ORT_VERSION)"
echo "build_peer_backend: use it with --peer-backend-dir $OUT"

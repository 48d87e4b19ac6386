#!/usr/bin/env bash
# `make image`: the base image (tools/make_base_image.sh), the wheels, then `podman build` of the Containerfile.
#   IMAGE=localhost/gebackend:latest (default)   the tag to build
# The wheels of the pinned dependencies are downloaded here, with this machine's pip settings (its index, proxy and
# certificates), into $GE_WHEELHOUSE (default ~/.cache/gebackend/wheels), and mounted read-only into the build:
# the build itself needs no access to a package index. The image is labelled org.gebackend.sources=<hash of what it
# was built from> (tools/image_sources.py); the container test reuses an image whose label matches the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/gebackend:latest}
RELEASE=${RELEASE:-$(. /etc/os-release && echo "${VERSION_CODENAME:?not a Debian release}")}
WHEELS=${GE_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/gebackend/wheels}
export RELEASE
started=$(date +%s)
bash tools/make_base_image.sh
BASE=localhost/gebackend-base:$RELEASE
flags=$(bash tools/podman_flags.sh "$BASE") || exit $?
eval "$flags"

# the Python of the image (Debian's python3 of $RELEASE) must match the one that downloads the wheels
case "$RELEASE" in
    bookworm) image_python=3.11 ;;
    trixie) image_python=3.13 ;;
    *) image_python="" ;;
esac
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
host_python=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pip_options=""
if [ "$image_python" = "$host_python" ]; then
    mkdir -p "$WHEELS"
    requirements=$(mktemp)
    trap 'rm -f "$requirements"' EXIT
    "$PY" -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > "$requirements"
    echo "build_image: wheels for Python $host_python into $WHEELS"
    "$PY" -m pip download --quiet --disable-pip-version-check --only-binary=:all: -d "$WHEELS" \
        -c constraints.txt -r "$requirements" "setuptools>=69" wheel 2>&1 | grep -v "^WARNING: Location" || true
    pip_options="--no-index --find-links /wheels"
else
    echo "build_image: this machine's Python is $host_python, the image's ${image_python:-unknown}: pip in the build uses its index"
fi

sources=$(python3 tools/image_sources.py)
echo "build_image: podman ${PODMAN_RUNTIME:+$PODMAN_RUNTIME }build $IMAGE (sources $sources)"
# shellcheck disable=SC2086
podman $PODMAN_RUNTIME build $PODMAN_ULIMITS --pull=never --build-arg "BASE_IMAGE=$BASE" \
    --build-arg "PIP_OPTIONS=$pip_options" ${pip_options:+--volume "$WHEELS:/wheels:ro"} \
    --label "org.gebackend.sources=$sources" -t "$IMAGE" -f Containerfile .
# the images this replaced (untagged now): only ours, by their label
podman image prune -f --filter label=org.gebackend.sources >/dev/null 2>&1 || true
echo "build_image: $IMAGE built in $(( $(date +%s) - started ))s ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"

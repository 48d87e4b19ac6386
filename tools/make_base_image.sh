#!/usr/bin/env bash
# Makes the local base image the Containerfile starts FROM, without pulling anything from a registry:
#   debootstrap --variant=minbase <this machine's Debian release>  ->  tar  ->  podman import localhost/gebackend-base:<release>
#
#   bash tools/make_base_image.sh            # reuse the cached rootfs tarball if it is younger than MAX_AGE_DAYS
#   FORCE=1 bash tools/make_base_image.sh    # debootstrap again
#
# Needs root (debootstrap), debootstrap and podman (`make deploy-tools`). The tarball is cached under
# $GE_BASE_CACHE (default ~/.cache/gebackend/base) so that CI and the container test do not debootstrap every run.
set -euo pipefail

RELEASE=${RELEASE:-$(. /etc/os-release && echo "${VERSION_CODENAME:?not a Debian release}")}
# The Debian mirrors this machine's apt already uses (its deb822 .sources or sources.list), unless given
apt_mirror() {  # $1: the suite, e.g. bookworm or bookworm-security
    python3 - "$1" <<'PY'
import glob, sys
suite = sys.argv[1]
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for block in open(path).read().split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line and not line.startswith("#"))
        if suite in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
            print(fields["URIs"].split()[0]); sys.exit(0)
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for words in (line.split() for line in lines):
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
            print(words[1]); sys.exit(0)
sys.exit(1)
PY
}
MIRROR=${MIRROR:-$(apt_mirror "$RELEASE")} || { echo "make_base_image: no apt source for $RELEASE here; set MIRROR" >&2; exit 3; }
SECURITY_MIRROR=${SECURITY_MIRROR:-$(apt_mirror "$RELEASE-security" || echo "")}
CACHE=${GE_BASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gebackend/base}
IMAGE=${BASE_IMAGE:-localhost/gebackend-base}
MAX_AGE_DAYS=${MAX_AGE_DAYS:-7}
LABEL=org.gebackend.rootfs-sha256

for tool in debootstrap podman tar sha256sum; do
    command -v "$tool" >/dev/null || { echo "make_base_image: $tool is not installed (make deploy-tools)" >&2; exit 3; }
done
[ "$(id -u)" = 0 ] || { echo "make_base_image: debootstrap needs root" >&2; exit 3; }

mkdir -p "$CACHE"
tarball="$CACHE/$RELEASE-minbase.tar"
if [ -n "${FORCE:-}" ] || [ ! -s "$tarball" ] || [ -n "$(find "$tarball" -mtime +"$MAX_AGE_DAYS")" ]; then
    work=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    started=$(date +%s)
    echo "make_base_image: debootstrap --variant=minbase $RELEASE from $MIRROR"
    debootstrap --variant=minbase "$RELEASE" "$work/rootfs" "$MIRROR" > "$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    # security and point updates for the packages the Containerfile installs
    cat > "$work/rootfs/etc/apt/sources.list" <<LIST
deb $MIRROR $RELEASE main
deb $MIRROR $RELEASE-updates main
LIST
    [ -z "$SECURITY_MIRROR" ] || echo "deb $SECURITY_MIRROR $RELEASE-security main" >> "$work/rootfs/etc/apt/sources.list"
    rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/debootstrap"
    tar -C "$work/rootfs" --numeric-owner --xattrs -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
    echo "make_base_image: rootfs $(du -sh "$tarball" | cut -f1) in $(( $(date +%s) - started ))s -> $tarball"
else
    echo "make_base_image: reusing $tarball (younger than $MAX_AGE_DAYS days; FORCE=1 to make it again)"
fi

sha=$(sha256sum "$tarball" | cut -d' ' -f1)
have=$(podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$IMAGE:$RELEASE" 2>/dev/null || true)
if [ "$have" != "$sha" ]; then
    podman import --quiet \
        --change "LABEL $LABEL=$sha" \
        --change "LABEL org.opencontainers.image.description=Debian $RELEASE minbase (debootstrap)" \
        --change 'CMD ["/bin/bash"]' \
        "$tarball" "$IMAGE:$RELEASE" >/dev/null
    echo "make_base_image: imported $IMAGE:$RELEASE"
else
    echo "make_base_image: $IMAGE:$RELEASE is up to date"
fi
podman tag "$IMAGE:$RELEASE" "$IMAGE:latest"

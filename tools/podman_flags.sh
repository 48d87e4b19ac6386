#!/usr/bin/env bash
# Finds the podman flags that run a container on this machine, and prints them as shell assignments:
#   PODMAN_RUNTIME='--runtime runc'   (empty: podman's default OCI runtime works)
#   PODMAN_ULIMITS='--ulimit nofile=N:N --ulimit nproc=M:M'
#   eval "$(bash tools/podman_flags.sh IMAGE)"
# Exit 3, saying why, when podman cannot run a container here.
#
# Why (seen on restricted hosts, see docs/deploy.md, Podman on restricted hosts): podman raises
# RLIMIT_NOFILE/NPROC above the caller's hard limits, which fails without CAP_SYS_RESOURCE; and crun refuses a
# host with cgroup v1 plus a cgroup2 hierarchy that has controllers ("cgroups in hybrid mode not supported"),
# where runc works.
set -uo pipefail
IMAGE=${1:?usage: podman_flags.sh IMAGE}
command -v podman >/dev/null || { echo "podman is not installed (make deploy-tools)" >&2; exit 3; }

# podman's defaults first; then with limits no higher than ours (16384 at most: podman's own limits may be lower
# than the shell's, as they were here)
cap() { local v; v=$(ulimit -H "$1"); { [ "$v" = unlimited ] || [ "$v" -gt 16384 ]; } && v=16384; echo "$v"; }
LIMITED="--ulimit nofile=$(cap -n):$(cap -n) --ulimit nproc=$(cap -u):$(cap -u)"
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
for ulimits in "" "$LIMITED"; do
    for runtime in "" runc crun; do
        if [ -n "$runtime" ] && ! command -v "$runtime" >/dev/null; then
            continue
        fi
        flags=${runtime:+--runtime $runtime}
        # shellcheck disable=SC2086
        if timeout 90 podman $flags run --rm $ulimits --network none --entrypoint /bin/true "$IMAGE" >/dev/null 2>>"$errors"; then
            echo "PODMAN_RUNTIME='$flags'"
            echo "PODMAN_ULIMITS='$ulimits'"
            exit 0
        fi
        echo "    (runtime ${runtime:-default}${ulimits:+, $ulimits}: failed)" >> "$errors"
    done
done
echo "podman cannot run a container on this machine:" >&2
sed 's/^/  /' "$errors" >&2
exit 3

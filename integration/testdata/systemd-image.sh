#!/usr/bin/env bash
# Builds the Debian image with systemd as PID 1 that the real-systemd tests
# run (integration/scope_test.go) unless it exists: debootstrap into a
# temporary root, then `docker import`. .ci/run calls it before the tests,
# on an idle machine; the tests call it when the image is missing.
# Usage: systemd-image.sh IMAGE
set -euo pipefail
image=${1:?usage: systemd-image.sh IMAGE}
if docker image inspect "$image" >/dev/null 2>&1; then
	exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$root/rootfs" >"$root/debootstrap.log" 2>&1 || {
	tail -c 4000 "$root/debootstrap.log" >&2
	exit 1
}
tar -C "$root/rootfs" -c . | docker import - "$image" >/dev/null

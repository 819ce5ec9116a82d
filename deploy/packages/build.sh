#!/bin/sh
# build.sh BIN_DIR OUT_DIR VERSION: the runnerd and controlplane .deb
# packages of the static binaries in BIN_DIR (runnerd, runnerd-child,
# controlplane: `make build`), written to OUT_DIR, with nfpm pinned in
# tools/packages/go.mod. `make packages` and the package tests
# (integration/packages_test.go) run it.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 BIN_DIR OUT_DIR VERSION" >&2; exit 2; }
bin=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
cd "$(dirname "$0")/../.."
export RUNNERD_PKG_BIN="$bin" RUNNERD_PKG_VERSION="$3"
for p in runnerd controlplane; do
	go tool -modfile=tools/packages/go.mod nfpm package --config "deploy/packages/$p.yaml" --packager deb --target "$out/"
done

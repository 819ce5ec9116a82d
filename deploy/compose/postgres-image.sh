#!/bin/sh
# Builds the compose file's PostgreSQL image locally from Debian's own
# packages: nothing is pulled from a registry. debootstrap makes a minimal
# bookworm with postgresql-15 (about a minute), `docker import` turns it into
# an image that runs PostgreSQL as the unprivileged `postgres` user.
# Needs root (debootstrap) and a Debian mirror; installs debootstrap with
# apt-get when it is missing. An existing image is kept (REBUILD=1 rebuilds).
set -eu

IMAGE=${IMAGE:-runnerd-postgres:15}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
here=$(cd "$(dirname "$0")" && pwd)

if [ -z "${REBUILD:-}" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
	echo "$IMAGE: already built (REBUILD=1 to rebuild)"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "postgres-image.sh: run as root (debootstrap needs it)" >&2
	exit 1
fi
command -v debootstrap >/dev/null || apt-get install -y debootstrap

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
root=$work/root
debootstrap --variant=minbase --include=postgresql-15 bookworm "$root" "$MIRROR"

# The package's own cluster and caches are not needed: the entrypoint makes
# the cluster in the data volume on first start.
rm -rf "$root/var/lib/postgresql/15" "$root/etc/postgresql/15" \
	"$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/* \
	"$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info"
install -d -m 0700 -o "$(chroot "$root" id -u postgres)" -g "$(chroot "$root" id -g postgres)" \
	"$root/var/lib/postgresql/data"
install -m 0755 "$here/postgres-entrypoint.sh" "$root/usr/local/bin/runnerd-postgres"

tar -C "$root" -c . | docker import \
	--change 'USER postgres' \
	--change 'ENV PGDATA=/var/lib/postgresql/data' \
	--change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'EXPOSE 5432' \
	--change 'VOLUME /var/lib/postgresql/data' \
	--change 'ENTRYPOINT ["/usr/local/bin/runnerd-postgres"]' \
	- "$IMAGE"
echo "$IMAGE: built"

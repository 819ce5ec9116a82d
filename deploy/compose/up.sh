#!/bin/sh
# Builds everything this compose file runs, on this machine (no registry),
# registers the two hosts and a user token, and starts the fleet:
# PostgreSQL, two control-plane replicas (127.0.0.1:8081, :8082) and two host
# daemons. Run from anywhere, as root (debootstrap for the PostgreSQL image,
# and the state directories belong to the containers' uid 10001).
# `make compose-up` runs it; down.sh (`make compose-down`) undoes it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
uid=10001 # the USER of the controlplane and runnerd images

if [ -n "${COMPOSE:-}" ]; then :
elif command -v docker-compose >/dev/null; then COMPOSE=docker-compose
else COMPOSE="docker compose"; fi
compose() { $COMPOSE -f "$here/docker-compose.yml" "$@"; }

make -C "$repo" build
"$here/postgres-image.sh"
compose build

state=$here/.state
for d in "$state/controlplane" "$state/runnerd-1/etc" "$state/runnerd-1/state" \
	"$state/runnerd-2/etc" "$state/runnerd-2/state"; do
	install -d -m 0700 -o "$uid" -g "$uid" "$d"
done

compose up -d postgres
printf 'waiting for PostgreSQL'
until [ "$(docker inspect --format '{{.State.Health.Status}}' "$(compose ps -q postgres)")" = healthy ]; do
	printf .
	sleep 1
done
echo

# One user token for the people and tools of this fleet, and one token per
# host: made once, through a replica's binary, into the database (hashes)
# and 0600 files under .state/. Every replica accepts them.
if [ ! -s "$state/controlplane/user-token" ]; then
	compose run --rm --no-deps -v "$state/controlplane:/out" controlplane-1 \
		token create compose --token-file /out/user-token
fi
for h in runnerd-1 runnerd-2; do
	if [ ! -s "$state/$h/etc/host-token" ]; then
		compose run --rm --no-deps -v "$state/$h/etc:/out" controlplane-1 \
			host add "$h" --token-file /out/host-token
	fi
done

compose up -d
cat <<MSG

The fleet is up: replicas http://127.0.0.1:8081 and http://127.0.0.1:8082 on one PostgreSQL.
User token: $state/controlplane/user-token (admin pages: any user name, the token as password).
Send a turn through replica 1:
  $repo/bin/controlplane submit --server http://127.0.0.1:8081 --user-token-file $state/controlplane/user-token \\
    --new --image process --agent /usr/local/bin/demoagent --prompt hello
Servers as each replica sees them: http://127.0.0.1:8081/admin/servers, http://127.0.0.1:8082/admin/servers
Logs: $COMPOSE -f $here/docker-compose.yml logs -f
MSG

#!/bin/sh
# Stops the compose fleet and removes its containers, its database volume and
# its tokens and daemon state (.state/): the next up.sh starts afresh. The
# images stay (REBUILD=1 up.sh rebuilds the PostgreSQL one).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${COMPOSE:-}" ]; then :
elif command -v docker-compose >/dev/null; then COMPOSE=docker-compose
else COMPOSE="docker compose"; fi
$COMPOSE -f "$here/docker-compose.yml" down -v --remove-orphans
rm -rf "$here/.state"

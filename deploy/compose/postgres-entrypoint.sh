#!/bin/sh
# PID 1 of the runnerd-postgres image, run as the postgres user: on first
# start it makes the cluster in $PGDATA with the POSTGRES_USER role
# (password POSTGRES_PASSWORD, scram-sha-256 over TCP) and the POSTGRES_DB
# database; then it runs PostgreSQL in the foreground.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:?POSTGRES_USER is required}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
: "${POSTGRES_DB:=$POSTGRES_USER}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	pw=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
	initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" -E UTF8 --locale=C.UTF-8 \
		--auth-local=trust --auth-host=scram-sha-256 >/dev/null
	rm -f "$pw"
	printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/tmp" -w start >/dev/null
	echo 'CREATE DATABASE :"db";' |
		psql -h /tmp -U "$POSTGRES_USER" -d postgres -v ON_ERROR_STOP=1 -v db="$POSTGRES_DB" >/dev/null
	pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
	echo "runnerd-postgres: cluster initialised, database $POSTGRES_DB"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp

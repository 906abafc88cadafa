#!/bin/sh
# The real image's first start, reduced to what the stack uses: a new data directory gets a
# superuser POSTGRES_USER with POSTGRES_PASSWORD (password sign-in over TCP) and the database
# POSTGRES_DB (UTF-8, as the real image makes it); then the server runs in the foreground,
# listening on every address.
set -eu
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /run/postgresql
    chown -R postgres:postgres "$PGDATA" /run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
: "${POSTGRES_USER:=postgres}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    secret=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$secret"
    initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$secret" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$secret"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" \
            | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
exec "$@" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql

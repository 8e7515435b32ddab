#!/usr/bin/env bash
# A private PostgreSQL server for the tests and the webhook benchmark; prints its URL on stdout.
#
#   export GATEKEEPER_TEST_POSTGRES_URL="$(tools/postgres-test-server.sh)"   # start (or find) it
#   tools/postgres-test-server.sh stop
#
# Debian's packages: installed with apt-get when missing and this runs as root (CI); otherwise it stops with
# the command to run. The cluster lives in its own directory ($GATEKEEPER_PG_DIR, default
# /tmp/gatekeeper-pg-<uid>) on its own port ($GATEKEEPER_PG_PORT, default 54329), listening on 127.0.0.1 only,
# with trust authentication: a throwaway test server, never a deployment. PostgreSQL refuses to run as root,
# so as root the cluster belongs to the `postgres` user the package creates. Idempotent: a running cluster is
# reused at once (about 0.1 s); exit status non-zero, with the reason on stderr, whenever no server answers.
set -euo pipefail

DIR="${GATEKEEPER_PG_DIR:-/tmp/gatekeeper-pg-$(id -u)}"
PORT="${GATEKEEPER_PG_PORT:-54329}"
DB=gatekeeper_test
ROLE=gatekeeper
URL="postgresql://$ROLE@127.0.0.1:$PORT/$DB"

fail() { echo "postgres-test-server: $*" >&2; exit 1; }

bindir() {
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

BIN=$(bindir || true)
if [ -z "$BIN" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "postgres-test-server: installing Debian's postgresql package" >&2
        # Only the server's files: the package's own cluster (main, port 5432) is not started.
        if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql >&2 \
               || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                    --no-install-recommends postgresql >&2; }; }; then
            fail "apt-get install postgresql failed"
        fi
        BIN=$(bindir || true)
    fi
    [ -n "$BIN" ] || fail "no PostgreSQL server found under /usr/lib/postgresql (install it: apt-get install postgresql)"
fi

# Run the server's programs as a user that is not root.
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || fail "running as root and there is no 'postgres' user to run the server as"
    as_owner() { runuser -u postgres -- "$@"; }
else
    as_owner() { "$@"; }
fi
pg_ctl() { as_owner "$BIN/pg_ctl" -D "$DIR/data" "$@"; }

if [ "${1:-}" = stop ]; then
    [ -d "$DIR/data" ] && pg_ctl stop -m fast >&2 || true
    exit 0
fi

if ! pg_ctl status >/dev/null 2>&1; then
    if [ ! -f "$DIR/data/PG_VERSION" ]; then
        rm -rf "$DIR"
        mkdir -p "$DIR"
        [ "$(id -u)" = 0 ] && chown postgres: "$DIR"
        as_owner "$BIN/initdb" -D "$DIR/data" -U "$ROLE" --auth=trust --encoding=UTF8 --no-locale >"$DIR/initdb.log" 2>&1 \
            || fail "initdb failed: $(tail -n 5 "$DIR/initdb.log")"
    fi
    # Room for several servers' connections (one per thread that used the database) in the benchmark.
    pg_ctl -l "$DIR/server.log" -w -t 60 \
        -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null \
        || fail "the server did not start: $(tail -n 5 "$DIR/server.log" 2>/dev/null)"
fi

PSQL=("$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$ROLE")
if [ "$("${PSQL[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]; then
    "${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB" >&2 || fail "could not create the database $DB"
fi
"${PSQL[@]}" -d "$DB" -tAc "SELECT 1" >/dev/null || fail "the server at $URL does not answer"
echo "$URL"

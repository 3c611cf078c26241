#!/usr/bin/env bash
# The idempotency demo: starts a throwaway PostgreSQL cluster, installs the
# extension and plays a payments scenario (concurrent duplicate deliveries, a
# retry after a crash-like rollback, a lease takeover with a fenced zombie, a
# fingerprint mismatch, a sweep), then stops the cluster and removes it.
# Usage, as root on Debian bookworm (installs what is missing): examples/demo.sh
# PG_MAJOR=NN selects another installed PostgreSQL major (default 15).
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../test/lib/pg-env
. "$src/test/lib/pg-env"
"$src/test/lib/ensure-packages"
"$src/test/lib/build-install"

bin=$PG_BINDIR
dir=$(mktemp -d /tmp/idempotency-demo.XXXXXX)
port=${IDEM_DEMO_PORT:-55990}
as_pg=()
if [ "$(id -u)" -eq 0 ]; then chown postgres "$dir"; as_pg=(runuser -u postgres --); fi

stop() {
	"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap stop EXIT

"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = '2s'
CONF
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
echo "throwaway cluster: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') in $dir"

"${as_pg[@]}" env PGHOST="$dir" PGPORT="$port" PGUSER=postgres PGDATABASE=postgres \
	/usr/bin/python3 "$src/examples/demo.py"

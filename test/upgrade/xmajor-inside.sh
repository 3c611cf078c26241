#!/usr/bin/env bash
# Runs inside the chroot of the newer PostgreSQL (test/suites/84-cross-major),
# as its postgres user:  xmajor-inside.sh SOURCE_PORT PORT DIR
# Starts a server of PG_MAJOR on 127.0.0.1:PORT that preloads the extension,
# restores the roles and database "src" of the older server on SOURCE_PORT
# with this version's pg_dumpall and pg_dump (the documented way), as
# database "restored", writes DIR/ready (or DIR/failed), and keeps the server
# up until DIR/done appears so that the host can check it.
set -euo pipefail
src_port=$1 port=$2 x=$3
export PATH=/usr/lib/postgresql/$PG_MAJOR/bin:$PATH
mkdir -p "$x"
started=0
cleanup() {
	if [ "$started" = 1 ]; then pg_ctl -D "$x/data" -m fast -w stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
trap 'echo "line $LINENO: $BASH_COMMAND" >"$x/failed"' ERR

initdb -D "$x/data" -A trust -U postgres --no-sync -E UTF8 --locale=C >"$x/initdb.log" 2>&1
cat >>"$x/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$x'
shared_preload_libraries = 'idempotency'
idempotency.sweep_interval = 0
timezone = 'UTC'
fsync = off
lc_messages = 'C'
CONF
pg_ctl -D "$x/data" -l "$x/server.log" -w start >/dev/null
started=1

old=(-h 127.0.0.1 -p "$src_port" -U postgres)
new=(-h 127.0.0.1 -p "$port" -U postgres)
pg_dumpall "${old[@]}" --globals-only >"$x/globals.sql"
# the role postgres exists already: that one statement fails, the others must not
psql "${new[@]}" -d postgres -X -q -f "$x/globals.sql" >"$x/globals.log" 2>&1 || true
if grep 'ERROR' "$x/globals.log" | grep -v 'role "postgres" already exists' | grep -q .; then
	cp "$x/globals.log" "$x/failed"; exit 1
fi
pg_dump "${old[@]}" -Fc -f "$x/src.dump" src
createdb "${new[@]}" restored
pg_restore "${new[@]}" --exit-on-error -d restored "$x/src.dump" >"$x/restore.log" 2>&1
echo ok >"$x/ready"
# the host checks the restored database, then says done (a cap, not a timing)
for _ in $(seq 1 3000); do
	[ -e "$x/done" ] && exit 0
	sleep 0.2
done
echo "the host never said done" >"$x/failed"
exit 1

#!/usr/bin/env bash
# The idempotency demo: starts a throwaway PostgreSQL cluster, installs the
# extension and plays a payments scenario (concurrent duplicate deliveries, a
# retry after a crash-like rollback, a lease takeover with a fenced zombie, a
# fingerprint mismatch, a sweep), then stops the cluster and removes it.
# Usage, as root on Debian bookworm: examples/demo.sh
# It installs only what builds and runs the extension and the demo, when
# missing (PostgreSQL, its server headers, make, gcc, Python with psycopg2),
# and says what it installed; the test toolchain is test/run-all's business.
# PG_MAJOR=NN selects another PostgreSQL major (default 15).
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../test/lib/pg-env
. "$src/test/lib/pg-env"

# ------------------------------------------------------------ packages
demo_packages=(
	"postgresql-$PG_MAJOR"                # the server and initdb/pg_ctl
	"postgresql-server-dev-$PG_MAJOR"     # PGXS: headers and pg_config to build the extension
	make gcc                              # the build
	python3 python3-psycopg2              # examples/demo.py
)
installed_packages() { dpkg-query -W -f='${db:Status-Abbrev}${Package}\n' | sed -n 's/^ii *//p' | sort; }
missing=()
for p in "${demo_packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "packages: nothing to install (${demo_packages[*]} are present)"
elif [ "$(id -u)" -ne 0 ]; then
	echo "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
	exit 1
else
	echo "packages: installing ${missing[*]} (and what they depend on)"
	before=$(mktemp)
	installed_packages >"$before"
	export DEBIAN_FRONTEND=noninteractive
	apt_log=$(mktemp /tmp/idempotency-demo-apt.XXXXXX)
	if ! { apt-get -o DPkg::Lock::Timeout=900 update &&
		apt-get -o DPkg::Lock::Timeout=900 install -y --no-install-recommends "${missing[@]}"; } >"$apt_log" 2>&1; then
		tail -n 20 "$apt_log" >&2
		echo "apt-get failed; its whole output is in $apt_log" >&2
		exit 1
	fi
	rm -f "$apt_log"
	added=$(installed_packages | comm -13 "$before" - | tr '\n' ' ')
	rm -f "$before"
	echo "packages: installed $(wc -w <<<"$added") packages: $added"
	# the Debian package may start a default cluster on port 5432; the demo
	# uses its own, so stop the one it started (pg_ctlcluster NN main start
	# brings it back)
	if [[ " ${missing[*]} " == *" postgresql-$PG_MAJOR "* ]] && command -v pg_lsclusters >/dev/null &&
		grep -q "^$PG_MAJOR *main .* online" <<<"$(pg_lsclusters -h 2>/dev/null)"; then
		pg_ctlcluster "$PG_MAJOR" main stop || true
		echo "packages: stopped the cluster $PG_MAJOR/main that installing postgresql-$PG_MAJOR started"
	fi
fi

# ------------------------------------------------------------ build
"$src/test/lib/build-install"
echo "built and installed the extension into PostgreSQL $PG_MAJOR ($(pg_config --pkglibdir)/idempotency.so)"

# ------------------------------------------------------------ the cluster
bin=$PG_BINDIR
dir=$(mktemp -d /tmp/idempotency-demo.XXXXXX)
port=${IDEM_DEMO_PORT:-55990}
as_pg=()
if [ "$(id -u)" -eq 0 ]; then chown postgres "$dir"; as_pg=(runuser -u postgres --); fi
# the postgres user may not be able to enter the clone (root's home is
# private): its commands run from the cluster's directory, and demo.py is
# handed to Python on standard input
cd "$dir"

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
	/usr/bin/python3 - <"$src/examples/demo.py"

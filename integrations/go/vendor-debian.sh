#!/bin/sh
# Make vendor/ from Debian's Go packages, so `go build -mod=vendor` and
# `go test -mod=vendor` need neither the module proxy nor the network:
#
#   apt-get install golang-go golang-github-jackc-pgx-v4-dev \
#       golang-github-jmespath-go-jmespath-dev golang-opentelemetry-otel-dev
#   ./vendor-debian.sh && go test -mod=vendor ./...
#
# vendor-debian.sh DIR does the same for the module in DIR, a service of
# your own that requires this module (the module path of go.mod) and
# the requirements of this go.mod: this package is copied from here into
# DIR/vendor with the others (README.md, "A new module, offline").
#
# Debian's golang-*-dev packages put their sources under /usr/share/gocode/src
# (GOCODE=... for another tree).  The packages the module imports from
# outside the standard library (pgx's database/sql driver, go-jmespath,
# OpenTelemetry's trace API; for this module's own tests also the
# OpenTelemetry SDK's in-memory exporter) are listed with
# all their dependencies in GOPATH mode over that tree, copied without their
# tests, and recorded in vendor/modules.txt under the module of go.mod that
# provides each, as `go mod vendor` would write it.  vendor/ is never
# committed: it is made from the packages installed where the build runs.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
self=$(sed -n 's/^module \([^ ]*\)$/\1/p' "$here/go.mod")
cd "${1:-$here}"
gocode=${GOCODE:-/usr/share/gocode/src}
roots="github.com/jackc/pgx/v4/stdlib github.com/jmespath/go-jmespath go.opentelemetry.io/otel/trace"
[ $# -gt 0 ] || roots="$roots go.opentelemetry.io/otel/sdk/trace/tracetest"   # this module's tests

for need in github.com/jackc/pgx/v4:golang-github-jackc-pgx-v4-dev \
	github.com/jmespath/go-jmespath:golang-github-jmespath-go-jmespath-dev \
	go.opentelemetry.io/otel/trace:golang-opentelemetry-otel-dev; do
	[ -d "$gocode/${need%%:*}" ] || {
		echo "vendor-debian.sh: $gocode has no ${need%%:*}; install ${need#*:}." >&2
		exit 1
	}
done
packages=$(GO111MODULE=off GOPATH="${gocode%/src}" GOFLAGS= \
	go list -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' $roots)
# go.mod's requirements, "module version" per line (in require blocks and single lines)
modules=$(sed -n -e 's/^require \([^ (]*\) \(v[^ ]*\).*$/\1 \2/p' \
	-e '/^require (/,/^)/s/^[[:space:]]\{1,\}\([^ ]*\) \(v[^ ]*\).*$/\1 \2/p' go.mod)

rm -rf vendor
mkdir vendor
: >vendor/modules.txt
echo "$modules" | while read -r module version; do
	[ -n "$module" ] || continue
	if [ "$module" = "$self" ]; then   # this package, required by a module of your own
		echo "# $module $version" >>vendor/modules.txt
		echo "## explicit; go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/go.mod")" >>vendor/modules.txt
		mkdir -p "vendor/$module"
		find "$here" -maxdepth 1 -type f -name '*.go' ! -name '*_test.go' -exec cp {} "vendor/$module/" \;
		install -m 644 "$here/LICENSE" "vendor/$module/LICENSE"
		echo "$module" >>vendor/modules.txt
		continue
	fi
	[ -d "$gocode/$module" ] || { echo "vendor-debian.sh: $gocode/$module is missing (its Debian -dev package?)" >&2; exit 1; }
	goversion=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gocode/$module/go.mod" 2>/dev/null || true)
	echo "# $module $version" >>vendor/modules.txt
	echo "## explicit${goversion:+; go $goversion}" >>vendor/modules.txt
	for f in LICENSE LICENSE.md LICENSE.txt COPYING PATENTS; do
		[ -f "$gocode/$module/$f" ] && install -D -m 644 "$gocode/$module/$f" "vendor/$module/$f"
	done
	for p in $packages; do
		# the longest module path wins: p belongs here unless a longer listed module holds it
		case "$p/" in "$module"/*) ;; *) continue ;; esac
		owner=$(echo "$modules" | awk -v p="$p/" '{ if (index(p, $1 "/") == 1 && length($1) > best) { best = length($1); m = $1 } } END { print m }')
		[ "$owner" = "$module" ] || continue
		mkdir -p "vendor/$p"
		find "$gocode/$p" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' -o -name '*.h' -o -name '*.c' \) \
			! -name '*_test.go' -exec cp {} "vendor/$p/" \;
		echo "$p" >>vendor/modules.txt
	done
done
# every imported package must have been placed under one of go.mod's modules
for p in $packages; do
	[ -d "vendor/$p" ] || { echo "vendor-debian.sh: no module of go.mod provides $p; add it to go.mod's require." >&2; exit 1; }
done
echo "vendor-debian.sh: $(echo "$packages" | wc -w) packages from $gocode into vendor/"

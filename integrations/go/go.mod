// The module lives in the integrations/go directory of the project's
// repository (https://github.com/idempotency-pg/idempotency), so its path is the repository's
// and its versions are tags integrations/go/vX.Y.Z (docs/integrations.md,
// "The project's address").
module github.com/idempotency-pg/idempotency/integrations/go

go 1.19

// The package uses database/sql (any driver), go-jmespath (EventKeys) and
// OpenTelemetry's trace API (Config.Tracer; nil: no spans); pgx is the driver
// of its tests and of the example server, the OpenTelemetry SDK (its
// in-memory exporter) that of the tests.  The versions are those of Debian
// bookworm's golang-*-dev packages, which the tests build from
// (vendor-debian.sh).
require (
	github.com/jackc/pgx/v4 v4.15.0
	github.com/jmespath/go-jmespath v0.4.0
	go.opentelemetry.io/otel v1.1.0
	go.opentelemetry.io/otel/sdk v1.1.0
	go.opentelemetry.io/otel/trace v1.1.0
)

require (
	github.com/jackc/chunkreader/v2 v2.0.1 // indirect
	github.com/jackc/pgconn v1.11.0 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgproto3/v2 v2.2.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20200714003250-2b9c44734f2b // indirect
	github.com/jackc/pgtype v1.10.0 // indirect
	golang.org/x/crypto v0.4.0 // indirect
	golang.org/x/sys v0.3.0 // indirect
	golang.org/x/text v0.7.0 // indirect
)

package idempotency

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation name to get a Tracer by for
// Config.Tracer and RunOptions.Tracer: otel.Tracer(idempotency.TracerName),
// or tracerProvider.Tracer(idempotency.TracerName).
const TracerName = "github.com/idempotency-pg/idempotency/integrations/go"

// The span attributes: the stable database semantic conventions' names, and
// the package's own.
const (
	AttrDBSystemName    = "db.system.name"          // always "postgresql"
	AttrDBOperationName = "db.operation.name"       // the extension's function: idem_claim, idem_complete, idem_release
	AttrDBStatusCode    = "db.response.status_code" // a failed call's SQLSTATE, when the driver says it
	AttrOutcome         = "idempotency.outcome"     // idem_claim's outcome: claimed, replay, failed, in_progress, mismatch
	AttrReplayed        = "idempotency.replayed"    // a stored answer was given instead of running the handler or fn
)

// startCall starts a client span named after the extension's function op
// (idem_claim, idem_complete, idem_release), a child of ctx's span; with a
// nil tracer it starts nothing and returns ctx and a nil span, which
// endCall ignores: an application without OpenTelemetry pays one nil check.
func startCall(ctx context.Context, tracer trace.Tracer, op string) (context.Context, trace.Span) {
	if tracer == nil {
		return ctx, nil
	}
	return tracer.Start(ctx, op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String(AttrDBSystemName, "postgresql"), attribute.String(AttrDBOperationName, op)))
}

// endCall ends span with idem_claim's outcome (when outcome is set) and
// err as its status, with the SQLSTATE of a driver's error that has a
// SQLState() method (pgx's *pgconn.PgError has).
func endCall(span trace.Span, outcome string, err error) {
	if span == nil {
		return
	}
	if outcome != "" {
		span.SetAttributes(attribute.String(AttrOutcome, outcome),
			attribute.Bool(AttrReplayed, outcome == "replay" || outcome == "failed"))
	}
	if err != nil {
		var coded interface{ SQLState() string }
		if errors.As(err, &coded) {
			span.SetAttributes(attribute.String(AttrDBStatusCode, coded.SQLState()))
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

package idempotency_test

// OpenTelemetry: the spans of a first call and a replay, recorded by the
// SDK's in-memory exporter (go.opentelemetry.io/otel/sdk/trace/tracetest).

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempotency-pg/idempotency/integrations/go"
)

// recording is a tracer whose ended spans the returned exporter holds.
func recording(t *testing.T) (trace.Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	return provider.Tracer(idempotency.TracerName), exporter
}

// spanText is a span as "name kind k=v ..." with its attributes in the order set, and its status when not unset.
func spanText(s tracetest.SpanStub) string {
	parts := []string{s.Name, s.SpanKind.String()}
	for _, a := range s.Attributes {
		parts = append(parts, fmt.Sprintf("%s=%s", a.Key, a.Value.Emit()))
	}
	if s.Status.Code.String() != "Unset" {
		parts = append(parts, "status="+s.Status.Code.String())
	}
	return strings.Join(parts, " ")
}

func spanTexts(exporter *tracetest.InMemoryExporter) []string {
	var texts []string
	for _, s := range exporter.GetSpans() {
		texts = append(texts, spanText(s))
	}
	exporter.Reset()
	return texts
}

func expectSpans(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: the spans\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

const (
	dbClaim    = "idem_claim client db.system.name=postgresql db.operation.name=idem_claim"
	dbComplete = "idem_complete client db.system.name=postgresql db.operation.name=idem_complete"
	dbRelease  = "idem_release client db.system.name=postgresql db.operation.name=idem_release"
)

func TestSpansMiddleware(t *testing.T) {
	needDB(t)
	tracer, exporter := recording(t)
	s := server(t, idempotency.Config{Tracer: tracer})
	post(t, s, key("otel-1"), `{"amount": 1}`)
	expectSpans(t, "a first call", spanTexts(exporter),
		dbClaim+" idempotency.outcome=claimed idempotency.replayed=false", dbComplete)
	post(t, s, key("otel-1"), `{"amount": 1}`)
	expectSpans(t, "a replay", spanTexts(exporter), dbClaim+" idempotency.outcome=replay idempotency.replayed=true")
	post(t, s, key("otel-1"), `{"amount": 2}`)
	expectSpans(t, "a mismatch", spanTexts(exporter), dbClaim+" idempotency.outcome=mismatch idempotency.replayed=false")
	post(t, s, key("otel-2"), `{"refuse": true}`)
	expectSpans(t, "a stored 4xx", spanTexts(exporter),
		dbClaim+" idempotency.outcome=claimed idempotency.replayed=false", dbRelease)
	post(t, s, key("otel-2"), `{"refuse": true}`)
	expectSpans(t, "a stored 4xx again", spanTexts(exporter),
		dbClaim+" idempotency.outcome=failed idempotency.replayed=true")

	// the request context's span (an HTTP instrumentation's) is the parent
	idempotent := idempotency.Middleware(idempotency.Config{DB: appDB, TenantSetting: tenantSetting, Tracer: tracer,
		Logger: log.New(io.Discard, "", 0)})(http.HandlerFunc(handler))
	traced := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), "POST /things", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		idempotent.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer traced.Close()
	post(t, traced, key("otel-3"), `{"amount": 3}`)
	spans := exporter.GetSpans()
	if len(spans) != 3 || spans[2].Name != "POST /things" {
		t.Fatalf("the request's spans: %v", spanTexts(exporter))
	}
	for _, s := range spans[:2] {
		if s.Parent.SpanID() != spans[2].SpanContext.SpanID() || s.SpanContext.TraceID() != spans[2].SpanContext.TraceID() {
			t.Errorf("%s is not a child of the request's span", s.Name)
		}
	}
}

func TestSpansRunAndParent(t *testing.T) {
	needDB(t)
	tracer, exporter := recording(t)
	ctx, parent := tracer.Start(context.Background(), "consume message")
	fn := func(tx *sql.Tx) (json.RawMessage, error) { return json.RawMessage(`{"ok": true}`), nil }
	opts := idempotency.RunOptions{TenantSetting: tenantSetting, Tracer: tracer}
	_, _, err1 := idempotency.Run(ctx, appDB, tenant, "otel-run", fn, opts)
	_, _, err2 := idempotency.Run(ctx, appDB, tenant, "otel-run", fn, opts)
	parent.End()
	spans := exporter.GetSpans()
	var texts []string
	for _, s := range spans {
		texts = append(texts, spanText(s))
		if s.Name != "consume message" && s.Parent.SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the context's span", s.Name)
		}
	}
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	expectSpans(t, "Run: a first call, a replay", texts,
		dbClaim+" idempotency.outcome=claimed idempotency.replayed=false", dbComplete,
		dbClaim+" idempotency.outcome=replay idempotency.replayed=true", "consume message internal")

	// an error is the span's status
	exporter.Reset()
	bad := opts
	bad.Lease = "not an interval"
	_, _, err := idempotency.Run(ctx, appDB, tenant, "otel-run-2", fn, bad)
	expectSpans(t, "a call that fails: its SQLSTATE (pgx's driver says it)", spanTexts(exporter),
		dbClaim+" db.response.status_code=22007 status=Error")
	if err == nil {
		t.Error("a lease that is not an interval is an error")
	}

	// no Tracer: no spans, and nothing else changes
	opts.Tracer = nil
	if out, replayed, err := idempotency.Run(ctx, appDB, tenant, "otel-run", fn, opts); err != nil || !replayed ||
		string(out) != `{"ok": true}` || len(exporter.GetSpans()) != 0 {
		t.Errorf("without a Tracer: %s %v %v, %d spans", out, replayed, err, len(exporter.GetSpans()))
	}
}

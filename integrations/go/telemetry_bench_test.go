package idempotency

// What a span costs per call of the extension's functions, beside no Tracer
// (the default):
//
//	go test -mod=vendor -run - -bench Spans -benchmem
//
// Figures, not a test: nothing here fails on a slow machine.

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func benchmarkCall(b *testing.B, tracer trace.Tracer) {
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_, span := startCall(ctx, tracer, "idem_claim")
		endCall(span, "replay", nil)
	}
}

func BenchmarkSpansNoTracer(b *testing.B) { benchmarkCall(b, nil) }

func BenchmarkSpansNoopTracer(b *testing.B) {
	benchmarkCall(b, trace.NewNoopTracerProvider().Tracer(TracerName))
}

func BenchmarkSpansRecorded(b *testing.B) {
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	benchmarkCall(b, provider.Tracer(TracerName))
}

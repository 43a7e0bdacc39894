package obs

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/gantry-gpu/gantry/shared/correlation"
)

func TestLoggerCarriesCorrelation(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, "svc", slog.LevelInfo)
	tp := NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(correlation.WithID(context.Background(), "c-1"), "op")
	defer span.End()
	log.InfoContext(ctx, "hello")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatal(err)
	}
	tid, _ := correlation.TraceIDs(ctx)
	if rec["correlation_id"] != "c-1" || rec["service"] != "svc" || rec["trace_id"] != tid {
		t.Fatalf("record %v", rec)
	}
}

func TestIDTracerProviderMintsAndContinues(t *testing.T) {
	tp := NewIDTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "op")
	tid, sid := correlation.TraceIDs(ctx)
	if tid == "" || sid == "" || span.SpanContext().TraceID().String() != tid {
		t.Fatalf("root: %q %q", tid, sid)
	}
	child, _ := tp.Tracer("t").Start(ctx, "child")
	ctid, csid := correlation.TraceIDs(child)
	if ctid != tid || csid == sid {
		t.Fatalf("child: %q %q (parent %q %q)", ctid, csid, tid, sid)
	}
	_, other := tp.Tracer("t").Start(context.Background(), "op")
	if other.SpanContext().TraceID().String() == tid {
		t.Fatal("two roots share a trace id")
	}
}

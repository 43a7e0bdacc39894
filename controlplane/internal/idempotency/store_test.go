package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/idempotency"
	"github.com/gantry-gpu/gantry/controlplane/internal/metrics"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestStoredBodies(t *testing.T) {
	pool := testenv.NewDatabase(t, apitest.Template)
	m := metrics.New()
	clk := clock.NewManual(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	store := &idempotency.Store{Pool: pool, Clock: clk, Metrics: m, Retention: time.Hour}
	fail := func(w http.ResponseWriter, r *http.Request, err error) { apierr.Writer{Service: "t"}.Write(w, r, err) }

	serve := func(key string, h http.HandlerFunc) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/things", strings.NewReader(`{}`))
		store.Serve(rec, req, idempotency.Scope{Principal: "user:1", Method: "POST", Route: "/things", Key: key}, []byte(`{}`), h, fail)
		return rec
	}
	stored := func(key string) (body []byte, found bool) {
		err := pool.QueryRow(context.Background(), `SELECT response_body FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&body)
		return body, err == nil
	}

	// Empty body: the key is kept (so a retry replays the status), the body never is.
	rec := serve("empty", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
	if body, found := stored("empty"); rec.Code != 201 || !found || body != nil {
		t.Fatalf("empty: %d found=%v body=%q", rec.Code, found, body)
	}
	if testutil.ToFloat64(m.IdempotencySkippedEmpty) != 1 {
		t.Fatal("empty body not counted")
	}

	// Non-JSON body.
	serve("text", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(201)
		_, _ = w.Write([]byte("created"))
	})
	if body, found := stored("text"); !found || body != nil {
		t.Fatalf("text: found=%v body=%q", found, body)
	}
	if testutil.ToFloat64(m.IdempotencySkippedNonJSON) != 1 {
		t.Fatal("non-JSON body not counted")
	}

	// A JSON body with a secret is stored redacted; the first caller still got it whole.
	rec = serve("secret", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"id":"c1","client_secret":"s3cr3t"}`))
	})
	body, _ := stored("secret")
	if !strings.Contains(rec.Body.String(), "s3cr3t") || strings.Contains(string(body), "s3cr3t") || !strings.Contains(string(body), `"c1"`) {
		t.Fatalf("first %s stored %s", rec.Body, body)
	}
	if testutil.ToFloat64(m.IdempotencyPersistedJSON) != 1 {
		t.Fatal("JSON body not counted")
	}

	// Retention: once expired, the same key runs afresh.
	clk.Advance(25 * time.Hour)
	runs := 0
	serve("empty", func(w http.ResponseWriter, _ *http.Request) { runs++; w.WriteHeader(201) })
	if runs != 1 {
		t.Fatal("expired key was replayed instead of run")
	}
	// A key is kept at least 24h even when configured shorter.
	var ttl time.Duration
	var created, expires time.Time
	if err := pool.QueryRow(context.Background(), `SELECT created_at, expires_at FROM idempotency_keys WHERE idempotency_key = 'empty'`).Scan(&created, &expires); err != nil {
		t.Fatal(err)
	}
	if ttl = expires.Sub(created); ttl < 24*time.Hour {
		t.Fatalf("retention %v", ttl)
	}
}

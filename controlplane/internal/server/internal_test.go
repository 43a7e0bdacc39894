package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
	"github.com/gantry-gpu/gantry/controlplane/internal/metrics"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// No operation of this change requires X-Project-ID yet (allocations will), so the rule
// is exercised on the middleware with an operation that declares the header required.
func TestMissingProjectHeaderIsInvalidRequest(t *testing.T) {
	s := &server{}
	op := &contract.Op{ProjectHeader: true, HeaderRequired: true}
	r := httptest.NewRequest("GET", "/x", nil)
	_, err := s.projectContext(context.Background(), r, op, chi.NewRouteContext())
	e, ok := apierr.As(err)
	if !ok || e.Code != apierr.InvalidRequest || e.HTTPStatus() != 400 || e.Details["reason"] != "project_context_missing" {
		t.Fatalf("got %v", err)
	}

	// An optional header that is absent is no project context, not an error.
	op.HeaderRequired = false
	if p, err := s.projectContext(context.Background(), r, op, chi.NewRouteContext()); err != nil || p.ID.String() != "00000000-0000-0000-0000-000000000000" {
		t.Fatalf("optional: %v %v", p, err)
	}

	// A malformed header is refused before any lookup.
	op.HeaderRequired = true
	r.Header.Set("X-Project-ID", "not-a-uuid")
	if _, err := s.projectContext(context.Background(), r, op, chi.NewRouteContext()); apierr.CodeOf(err) != apierr.InvalidRequest {
		t.Fatalf("malformed: %v", err)
	}

	// The generated wrapper's own missing-header error maps the same way.
	m := errorMapper{writer: apierr.Writer{Service: ServiceName}, log: slog.New(slog.DiscardHandler)}
	rec := httptest.NewRecorder()
	m.paramError(rec, httptest.NewRequest("GET", "/x", nil), &api.RequiredHeaderError{ParamName: "X-Project-ID"})
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"invalid_request"`) {
		t.Fatalf("param error: %d %s", rec.Code, rec.Body)
	}
}

type panickingAPI struct{ *API }

func (panickingAPI) GetHealth(context.Context, api.GetHealthRequestObject) (api.GetHealthResponseObject, error) {
	panic("secret database password in panic text")
}

func TestPanicBecomesInternalErrorWithoutText(t *testing.T) {
	var logs strings.Builder
	h := New(Deps{
		Logger:   obs.NewLogger(&logs, ServiceName, slog.LevelInfo),
		Contract: contract.MustLoad(),
		API:      panickingAPI{&API{}},
		Metrics:  metrics.New(),
		Tracer:   obs.NewTracerProvider(),
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var env apierr.Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatal(err)
	}
	if env.Code != apierr.InternalError || env.CorrelationID == "" || env.CorrelationID != resp.Header.Get("X-Request-Id") {
		t.Fatalf("envelope %+v", env)
	}
	if strings.Contains(string(body), "secret") || strings.Contains(string(body), "goroutine") {
		t.Fatalf("panic text leaked: %s", body)
	}
	if !strings.Contains(logs.String(), "panic serving request") || !strings.Contains(logs.String(), env.CorrelationID) {
		t.Fatalf("panic not logged with correlation id: %s", logs.String())
	}
}

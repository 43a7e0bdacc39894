// Package apitest starts the whole control plane (app.New, the same assembly as
// production) on a real PostgreSQL database and real NATS, per test, behind an
// httptest server, and hands tests the generated client. Every response a test receives
// through it is checked against the contract and must carry X-Request-Id, so the
// document and the server cannot drift apart.
package apitest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/jobs"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/obs"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// Template is the migrated template every test database is cloned from.
var Template = testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole}

// Env is one running control plane.
type Env struct {
	T      testing.TB
	App    *app.App
	Server *httptest.Server
	Pool   *pgxpool.Pool
	// Validated counts responses checked against the contract.
	Validated atomic.Int64
	mux       *chi.Mux
}

// Option adjusts the configuration before the app is assembled.
type Option func(*app.Config, *app.Options)

// New starts a control plane for t on its own database and its own event stream.
func New(t testing.TB, opts ...Option) *Env {
	t.Helper()
	pool := testenv.NewDatabase(t, Template)
	// The control plane runs as the application's database role, as in production
	// (docs/development.md, "Database roles"): every suite built on this env proves the
	// application works with that role's privileges alone.
	if role, err := db.CheckSessionRole(context.Background(), pool); err != nil || role != db.AppRole {
		t.Fatalf("apitest: the test database pool logs in as %q: %v", role, err)
	}
	ns := testenv.Namespace(t)
	authCfg := auth.DefaultConfig()
	authCfg.MasterKey = auth.DevMasterKey()
	cfg := app.Config{
		HTTPAddr:             "127.0.0.1:0",
		DatabaseURL:          pool.Config().ConnString(),
		NATSURL:              testenv.NATS(t),
		LogLevel:             "error",
		MaxBodyBytes:         1 << 20,
		RateLimits:           "auth=100000,admin=100000,api=100000,internal=100000",
		IdempotencyRetention: 24 * time.Hour,
		EventsStream:         "TEST_EVENTS_" + strings.ToUpper(ns),
		EventsSubjectPrefix:  "test." + ns + ".events.",
		ShutdownTimeout:      5 * time.Second,
		Auth:                 authCfg,
		// Object bytes go to a directory of the test's own (never .dev/storage).
		Blob: blob.Config{Driver: "fs", FSRoot: t.TempDir()},
		// Background jobs are fetched promptly (insert notifications still wake it first).
		Jobs: jobs.Config{FetchPollInterval: 50 * time.Millisecond, StopTimeout: 5 * time.Second},
	}
	var o app.Options
	o.Pool = pool
	for _, opt := range opts {
		opt(&cfg, &o)
	}
	log := obs.NewLogger(testWriter{t}, "gantry-controlplane", cfg.Level())
	ctx := context.Background()
	a, err := app.New(ctx, cfg, log, o)
	if err != nil {
		t.Fatalf("assemble control plane: %v", err)
	}
	t.Cleanup(a.Close)
	if err := a.Relay.EnsureStream(ctx); err != nil {
		t.Fatalf("events stream: %v", err)
	}
	// The stream is deleted over a connection of the harness's own, so a test may close
	// the app's connection (readiness) without leaking its stream.
	nc, err := nats.Connect(cfg.NATSURL)
	if err != nil {
		t.Fatalf("nats: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.CleanupStreams(t, js, cfg.EventsStream)
	if cfg.Provisioning.Stream == "" { // app derives it from the events stream (provisioning dispatch)
		testenv.CleanupStreams(t, js, cfg.EventsStream+"_PROVISIONING")
	}
	if cfg.Fabric.PresenceBucket == "" { // app derives it from the events stream
		testenv.CleanupKV(t, js, cfg.EventsStream+"_FABRIC_PRESENCE")
	}
	e := &Env{T: t, App: a, Pool: pool, mux: a.Handler.(*chi.Mux)}
	e.Server = httptest.NewServer(a.Handler)
	t.Cleanup(e.Server.Close)
	return e
}

// WithConfig edits the configuration.
func WithConfig(f func(*app.Config)) Option { return func(c *app.Config, _ *app.Options) { f(c) } }

// WithOptions edits the injected parts (clock, ids).
func WithOptions(f func(*app.Options)) Option { return func(_ *app.Config, o *app.Options) { f(o) } }

// HTTPClient returns a client that validates every response against the contract.
func (e *Env) HTTPClient() *http.Client {
	return &http.Client{Transport: &validatingTransport{env: e, next: http.DefaultTransport}, Timeout: 30 * time.Second}
}

// Client is the generated client authenticated with token ("" for none).
func (e *Env) Client(token string) *api.ClientWithResponses {
	c, err := api.NewClientWithResponses(e.Server.URL, api.WithHTTPClient(e.HTTPClient()),
		api.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			return nil
		}))
	if err != nil {
		e.T.Fatal(err)
	}
	return c
}

// Do sends a raw request through the validating client.
func (e *Env) Do(req *http.Request) *http.Response {
	e.T.Helper()
	resp, err := e.HTTPClient().Do(req)
	if err != nil {
		e.T.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	// A body the test does not close keeps the client's timeout goroutine (and the
	// connection) alive for up to 30 s, which the goroutine-leak checks report: closed at
	// the end of the test at the latest (closing twice is harmless).
	e.T.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// Request builds a raw request to path with an optional bearer token and JSON body.
func (e *Env) Request(method, path, token, body string) *http.Request {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.Server.URL+path, r)
	if err != nil {
		e.T.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

type validatingTransport struct {
	env  *Env
	next http.RoundTripper
}

func (v *validatingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := v.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	t := v.env.T
	if resp.Header.Get("X-Request-Id") == "" {
		t.Errorf("%s %s -> %d has no X-Request-Id", req.Method, req.URL.Path, resp.StatusCode)
	}
	rctx := chi.NewRouteContext()
	pattern := v.env.mux.Find(rctx, req.Method, req.URL.Path)
	op := v.env.App.Contract.Op(req.Method, pattern)
	if op == nil {
		return resp, nil // not an operation of the contract (404/405 answers)
	}
	params := map[string]string{}
	for i, k := range rctx.URLParams.Keys {
		params[k] = rctx.URLParams.Values[i]
	}
	if err := op.ValidateResponse(req.Context(), req, params, resp); err != nil {
		t.Errorf("contract violation: %v", err)
	}
	v.env.Validated.Add(1)
	return resp, nil
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

package gateway_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/loggateway/gateway"
	"github.com/gantry-gpu/gantry/loggateway/lokitest"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// fixture is a gateway in front of a fake Loki that decodes the real push format, with
// an in-process introspector (the real control plane is exercised in controlplane/e2e).
type fixture struct {
	t     *testing.T
	gw    *gateway.Gateway
	srv   *httptest.Server
	loki  *lokitest.Receiver
	clock *clock.Manual

	mu            sync.Mutex
	tokens        map[string]uuid.UUID
	introspectErr error
	calls         atomic.Int64
}

func newFixture(t *testing.T, edit func(*gateway.Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, loki: lokitest.New(t), clock: clock.NewManual(time.Date(2026, 11, 21, 6, 0, 0, 0, time.UTC)), tokens: map[string]uuid.UUID{}}
	cfg := gateway.DefaultConfig()
	cfg.LokiURL = f.loki.URL()
	cfg.LokiTenant = "ops"
	cfg.ForwardTimeout = 2 * time.Second
	if edit != nil {
		edit(&cfg)
	}
	gw, err := gateway.New(cfg, gateway.Options{
		Introspector: gateway.IntrospectorFunc(f.introspect),
		Clock:        f.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	f.gw = gw
	f.srv = httptest.NewServer(gw.Handler())
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) introspect(_ context.Context, token string) (uuid.UUID, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.introspectErr != nil {
		return uuid.Nil, f.introspectErr
	}
	if node, ok := f.tokens[token]; ok {
		return node, nil
	}
	return uuid.Nil, gateway.ErrUnauthenticated
}

// enroll mints a real-format node token for a new node.
func (f *fixture) enroll() (uuid.UUID, string) {
	node := uuid.Must(uuid.NewV7())
	tok, err := nodetoken.New(node, rand.Reader)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.tokens[tok] = node
	f.mu.Unlock()
	return node, tok
}

func (f *fixture) revoke(tok string) {
	f.mu.Lock()
	delete(f.tokens, tok)
	f.mu.Unlock()
}

func (f *fixture) do(method, path, token string, body io.Reader, header map[string]string) *http.Response {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

func (f *fixture) push(token string, body []byte) *http.Response {
	f.t.Helper()
	return f.do(http.MethodPost, gateway.PushPath, token, bytes.NewReader(body), map[string]string{"Content-Type": "application/x-protobuf"})
}

func (f *fixture) outcome(o gateway.Outcome) int {
	return int(testutil.ToFloat64(f.gw.Metrics().Batches.WithLabelValues(string(o))))
}

// outcomes asserts every outcome counter at once, so a test also proves nothing else moved.
func (f *fixture) outcomes(want map[gateway.Outcome]int) {
	f.t.Helper()
	for _, o := range gateway.Outcomes {
		if got := f.outcome(o); got != want[o] {
			f.t.Errorf("node_log_gateway_batches_total{outcome=%q} = %d, want %d", o, got, want[o])
		}
	}
}

func errorCode(t *testing.T, resp *http.Response) string {
	t.Helper()
	var env struct {
		Code          string         `json:"code"`
		CorrelationID string         `json:"correlation_id"`
		Details       map[string]any `json:"details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatalf("error body: %v", err)
	}
	if env.CorrelationID == "" || env.Details["service"] != gateway.Service {
		t.Errorf("envelope lacks correlation id or service: %+v", env)
	}
	return env.Code
}

// lines is one stream's label string and lines, in order.
type lines struct {
	labels string
	lines  []string
}

func batch(ts time.Time, streams ...lines) *push.PushRequest {
	req := &push.PushRequest{}
	for _, st := range streams {
		s := push.Stream{Labels: st.labels}
		for i, l := range st.lines {
			s.Entries = append(s.Entries, push.Entry{Timestamp: ts.Add(time.Duration(i) * time.Millisecond), Line: l})
		}
		req.Streams = append(req.Streams, s)
	}
	return req
}

func TestPushStampsNodeLabelAndForwards(t *testing.T) {
	f := newFixture(t, nil)
	node, tok := f.enroll()
	now := f.clock.Now()
	req := batch(now,
		lines{`{job="gantry-nodeagent", stream="agent"}`, []string{"agent started", "tunnel up"}},
		lines{`{stream="provision"}`, []string{"pulling image"}},
	)
	req.Streams[0].Entries[0].StructuredMetadata = push.LabelsAdapter{{Name: "task_id", Value: "t-1"}}

	resp := f.push(tok, lokitest.Body(req))
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("push: %d", resp.StatusCode)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id")
	}
	pushes := f.loki.Pushes()
	if len(pushes) != 1 || pushes[0].Tenant != "ops" {
		t.Fatalf("loki got %+v", pushes)
	}
	entries := f.loki.Entries()
	if len(entries) != 3 {
		t.Fatalf("loki got %d entries", len(entries))
	}
	for _, e := range entries {
		if e.Labels["node_id"] != node.String() {
			t.Errorf("entry %q labels %v: node_id not stamped", e.Line, e.Labels)
		}
		if e.Line == "agent started" && (e.Labels["job"] != "gantry-nodeagent" || e.Metadata["task_id"] != "t-1" || !e.TS.Equal(now)) {
			t.Errorf("entry changed in transit: %+v", e)
		}
	}
	f.outcomes(map[gateway.Outcome]int{gateway.Accepted: 1})
	if got := testutil.ToFloat64(f.gw.Metrics().ForwardedBytes); got <= 0 {
		t.Errorf("forwarded bytes %v", got)
	}
}

func TestNodeCannotSpeakForAnother(t *testing.T) {
	f := newFixture(t, nil)
	node, tok := f.enroll()
	other, _ := f.enroll()
	req := batch(f.clock.Now(),
		lines{fmt.Sprintf(`{node_id=%q, job="x"}`, other), []string{"i am the other node"}},
		lines{fmt.Sprintf(`{job="y",node_id=%q}`, other), []string{"me too"}},
	)
	req.Streams[0].Entries[0].StructuredMetadata = push.LabelsAdapter{{Name: "node_id", Value: other.String()}, {Name: "task_id", Value: "t"}}
	if resp := f.push(tok, lokitest.Body(req)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("push: %d", resp.StatusCode)
	}
	entries := f.loki.Entries()
	if len(entries) != 2 {
		t.Fatalf("loki got %d entries", len(entries))
	}
	for _, e := range entries {
		if e.Labels["node_id"] != node.String() {
			t.Errorf("%q kept the claimed node_id: %v", e.Line, e.Labels)
		}
		if _, ok := e.Metadata["node_id"]; ok {
			t.Errorf("%q kept a node_id in structured metadata: %v", e.Line, e.Metadata)
		}
	}
	f.outcomes(map[gateway.Outcome]int{gateway.Accepted: 1})
}

func TestJSONForm(t *testing.T) {
	f := newFixture(t, nil)
	node, tok := f.enroll()
	ts := f.clock.Now()
	body := fmt.Sprintf(`{"streams":[{"stream":{"job":"j","node_id":"spoofed"},"values":[["%d","plain"],["%d","with meta",{"task_id":"t-9"}]]}]}`,
		ts.UnixNano(), ts.UnixNano()+1)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(body))
	_ = zw.Close()

	for _, tc := range []struct {
		name   string
		body   []byte
		header map[string]string
	}{
		{"plain", []byte(body), map[string]string{"Content-Type": "application/json"}},
		{"gzip", gz.Bytes(), map[string]string{"Content-Type": "application/json; charset=utf-8", "Content-Encoding": "gzip"}},
	} {
		resp := f.do(http.MethodPost, gateway.PushPath, tok, bytes.NewReader(tc.body), tc.header)
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("%s: %d", tc.name, resp.StatusCode)
		}
	}
	entries := f.loki.Entries()
	if len(entries) != 4 {
		t.Fatalf("loki got %d entries", len(entries))
	}
	for _, e := range entries {
		if e.Labels["node_id"] != node.String() || e.Labels["job"] != "j" {
			t.Errorf("labels %v", e.Labels)
		}
		if e.Line == "with meta" && e.Metadata["task_id"] != "t-9" {
			t.Errorf("metadata lost: %+v", e)
		}
		if e.Line == "plain" && !e.TS.Equal(ts) {
			t.Errorf("ts %v, want %v", e.TS, ts)
		}
	}
	f.outcomes(map[gateway.Outcome]int{gateway.Accepted: 2})
}

func TestRejectedMethod(t *testing.T) {
	f := newFixture(t, nil)
	_, tok := f.enroll()
	cases := []struct{ method, path string }{
		{http.MethodGet, gateway.PushPath},
		{http.MethodPut, gateway.PushPath},
		{http.MethodDelete, gateway.PushPath},
		{http.MethodPost, "/loki/api/v1/query_range"},
		{http.MethodPost, "/api/prom/push"},
		{http.MethodGet, "/loki/api/v1/labels"},
		{http.MethodPost, "/healthz"},
	}
	for _, c := range cases {
		resp := f.do(c.method, c.path, tok, strings.NewReader("x"), nil)
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
			t.Errorf("%s %s: %d allow %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"))
		}
		if code := errorCode(t, resp); code != "invalid_request" {
			t.Errorf("%s %s: code %s", c.method, c.path, code)
		}
	}
	f.outcomes(map[gateway.Outcome]int{gateway.RejectedMethod: len(cases)})
	if f.loki.Requests() != 0 || f.calls.Load() != 0 {
		t.Error("a refused method reached Loki or the control plane")
	}
}

func TestRejectedAuth(t *testing.T) {
	f := newFixture(t, nil)
	node, tok := f.enroll()
	body := lokitest.Body(batch(f.clock.Now(), lines{`{job="x"}`, []string{"line"}}))
	wellFormedUnknown, _ := nodetoken.New(node, rand.Reader)

	cases := []struct {
		name, header, code string
	}{
		{"missing", "", "token_missing"},
		{"not bearer", "Basic abc", "token_missing"},
		{"garbage", "Bearer nope", "token_invalid"},
		{"unknown token of the node", "Bearer " + wellFormedUnknown, "token_invalid"},
	}
	for _, c := range cases {
		resp := f.do(http.MethodPost, gateway.PushPath, "", bytes.NewReader(body), map[string]string{"Authorization": c.header})
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d", c.name, resp.StatusCode)
			continue
		}
		if code := errorCode(t, resp); code != c.code {
			t.Errorf("%s: code %s, want %s", c.name, code, c.code)
		}
	}
	f.outcomes(map[gateway.Outcome]int{gateway.RejectedAuth: len(cases)})
	if f.loki.Requests() != 0 {
		t.Fatal("an unauthenticated batch reached Loki")
	}

	// A refusal is cached for the negative TTL (5 s), then asked again.
	calls := f.calls.Load()
	f.push(wellFormedUnknown, body)
	if f.calls.Load() != calls {
		t.Error("a refused token was introspected again within the negative TTL")
	}
	f.clock.Advance(6 * time.Second)
	f.push(wellFormedUnknown, body)
	if f.calls.Load() != calls+1 {
		t.Error("a refused token was not introspected again after the negative TTL")
	}

	// An accepted token is cached for 30 s: revocation takes effect when it expires.
	if resp := f.push(tok, body); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("valid token: %d", resp.StatusCode)
	}
	f.revoke(tok)
	f.clock.Advance(10 * time.Second)
	if resp := f.push(tok, body); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("within the positive TTL: %d", resp.StatusCode)
	}
	f.clock.Advance(21 * time.Second)
	resp := f.push(tok, body)
	if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp) != "token_invalid" {
		t.Fatalf("revoked token after the positive TTL: %d", resp.StatusCode)
	}

	// The control plane unreachable: refused as retryable (503), never cached.
	f.mu.Lock()
	f.introspectErr = errors.New("connection refused")
	f.mu.Unlock()
	_, tok2 := f.enroll()
	resp = f.push(tok2, body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || errorCode(t, resp) != "service_unavailable" {
		t.Fatalf("introspection down: %d", resp.StatusCode)
	}
	f.mu.Lock()
	f.introspectErr = nil
	f.mu.Unlock()
	if resp := f.push(tok2, body); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("after the control plane came back: %d", resp.StatusCode)
	}
	f.outcomes(map[gateway.Outcome]int{gateway.RejectedAuth: len(cases) + 4, gateway.Accepted: 3})
}

func TestRejectedSizeFromContentLength(t *testing.T) {
	f := newFixture(t, func(c *gateway.Config) { c.MaxBytes = 64 << 10 })
	_, tok := f.enroll()
	body := bytes.Repeat([]byte{0xff}, 64<<10+1)
	resp := f.push(tok, body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || errorCode(t, resp) != "invalid_request" {
		t.Fatalf("over the cap: %d", resp.StatusCode)
	}
	// Refused from the header alone: the token was not even looked at.
	if f.calls.Load() != 0 {
		t.Error("an oversized batch cost an introspection")
	}
	// Without Content-Length (chunked) the cap holds while reading.
	chunked := f.do(http.MethodPost, gateway.PushPath, tok, io.MultiReader(bytes.NewReader([]byte{0x80, 0x80, 0x01}), bytes.NewReader(body)), nil)
	if chunked.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked over the cap: %d", chunked.StatusCode)
	}
	f.outcomes(map[gateway.Outcome]int{gateway.RejectedSize: 2})
	if f.loki.Requests() != 0 {
		t.Fatal("an oversized batch reached Loki")
	}
}

func TestDecompressionBombRefused(t *testing.T) {
	f := newFixture(t, nil) // default cap: 4 MiB decompressed
	_, tok := f.enroll()

	// A real batch that inflates past the cap: 8 MiB of one repeated line compresses to
	// a few hundred KiB, well under the cap on the wire.
	big := batch(f.clock.Now(), lines{`{job="bomb"}`, []string{strings.Repeat("A", 8<<20)}})
	bomb := lokitest.Body(big)
	if len(bomb) >= gateway.MaxBatchBytes {
		t.Fatalf("bomb is %d bytes on the wire", len(bomb))
	}
	resp := f.push(tok, bomb)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("snappy bomb: %d", resp.StatusCode)
	}

	// A forged header claiming 2 GiB with a tiny body: refused by the header, before any
	// allocation by it.
	forged := append(binaryUvarint(2<<30), 0x00)
	if resp := f.push(tok, forged); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("forged snappy header: %d", resp.StatusCode)
	}

	// A gzip bomb in the JSON form stops at the cap while decompressing.
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	_, _ = zw.Write([]byte(`{"streams":[{"stream":{"a":"b"},"values":[["1","`))
	_, _ = zw.Write(bytes.Repeat([]byte("B"), 16<<20))
	_, _ = zw.Write([]byte(`"]]}]}`))
	_ = zw.Close()
	resp = f.do(http.MethodPost, gateway.PushPath, tok, bytes.NewReader(gz.Bytes()), map[string]string{"Content-Type": "application/json", "Content-Encoding": "gzip"})
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("gzip bomb: %d", resp.StatusCode)
	}
	// And a gzip-wrapped protobuf body likewise.
	gz.Reset()
	zw = gzip.NewWriter(&gz)
	_, _ = zw.Write(bomb)
	_ = zw.Close()
	resp = f.do(http.MethodPost, gateway.PushPath, tok, bytes.NewReader(gz.Bytes()), map[string]string{"Content-Encoding": "gzip"})
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("gzip-wrapped snappy bomb: %d", resp.StatusCode)
	}
	f.outcomes(map[gateway.Outcome]int{gateway.RejectedSize: 4})
	if f.loki.Requests() != 0 {
		t.Fatal("a bomb reached Loki")
	}
}

func binaryUvarint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func TestMalformedBatch(t *testing.T) {
	f := newFixture(t, nil)
	_, tok := f.enroll()
	badLabels := lokitest.Body(batch(f.clock.Now(), lines{`{job=unquoted}`, []string{"x"}}))
	for name, body := range map[string][]byte{
		"not snappy":    []byte("\x05hello world, not snappy"),
		"not protobuf":  snappy.Encode(nil, []byte("\xff\xff\xff\xff garbage")),
		"bad labels":    badLabels,
		"empty":         {},
		"truncated hdr": {0x80},
	} {
		resp := f.push(tok, body)
		if resp.StatusCode != http.StatusBadRequest || errorCode(t, resp) != "invalid_request" {
			t.Errorf("%s: %d", name, resp.StatusCode)
		}
	}
	resp := f.do(http.MethodPost, gateway.PushPath, tok, strings.NewReader(`{"streams":[{"stream":{"a":"b"},"values":[["notanumber","x"]]}]}`), map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad JSON timestamp: %d", resp.StatusCode)
	}
	if got := testutil.ToFloat64(f.gw.Metrics().Invalid); got != 6 {
		t.Errorf("invalid batches %v, want 6", got)
	}
	f.outcomes(nil)
	if f.loki.Requests() != 0 {
		t.Fatal("a malformed batch reached Loki")
	}
}

func TestLokiAnswersPassedBack(t *testing.T) {
	f := newFixture(t, func(c *gateway.Config) { c.ForwardTimeout = 200 * time.Millisecond })
	_, tok := f.enroll()
	body := lokitest.Body(batch(f.clock.Now(), lines{`{job="x"}`, []string{"line"}}))

	f.loki.Script(lokitest.Response{Status: http.StatusTooManyRequests, RetryAfter: "7"})
	resp := f.push(tok, body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "7" || errorCode(t, resp) != "rate_limit_exceeded" {
		t.Fatalf("loki 429: %d retry-after %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	f.loki.Script(lokitest.Response{Status: http.StatusTooManyRequests})
	if resp := f.push(tok, body); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("loki 429 without Retry-After: %d %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for _, s := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable} {
		f.loki.Script(lokitest.Response{Status: s})
		resp := f.push(tok, body)
		if resp.StatusCode != http.StatusBadGateway || errorCode(t, resp) != "upstream_error" {
			t.Fatalf("loki %d: %d", s, resp.StatusCode)
		}
	}
	f.loki.Script(lokitest.Response{Delay: 2 * time.Second})
	if resp := f.push(tok, body); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("loki timeout: %d", resp.StatusCode)
	}
	f.loki.Script(lokitest.Response{Status: http.StatusBadRequest})
	if resp := f.push(tok, body); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("loki 400: %d", resp.StatusCode)
	}
	if resp := f.push(tok, body); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("loki back: %d", resp.StatusCode)
	}
	f.outcomes(map[gateway.Outcome]int{gateway.ForwardFailed: 6, gateway.Accepted: 1})
}

func TestLokiUnreachable(t *testing.T) {
	f := newFixture(t, func(c *gateway.Config) { c.LokiURL = "http://127.0.0.1:1" })
	_, tok := f.enroll()
	resp := f.push(tok, lokitest.Body(batch(f.clock.Now(), lines{`{job="x"}`, []string{"line"}})))
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("loki down: %d", resp.StatusCode)
	}
	f.outcomes(map[gateway.Outcome]int{gateway.ForwardFailed: 1})
}

func TestMemoryBudgetQueueTimeout(t *testing.T) {
	f := newFixture(t, func(c *gateway.Config) {
		c.MaxBytes = 4096
		c.MemoryBudget = 4096 // one batch at a time
		c.QueueTimeout = 50 * time.Millisecond
	})
	_, tok := f.enroll()
	body := lokitest.Body(batch(f.clock.Now(), lines{`{job="x"}`, []string{"line"}}))
	f.loki.Script(lokitest.Response{Delay: 500 * time.Millisecond})
	first := make(chan int)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+gateway.PushPath, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- 0
			return
		}
		_ = resp.Body.Close()
		first <- resp.StatusCode
	}()
	if !f.loki.WaitForRequests(1, 5*time.Second) {
		t.Fatal("first push never reached loki")
	}
	resp := f.push(tok, body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("saturated gateway: %d", resp.StatusCode)
	}
	if s := <-first; s != http.StatusNoContent {
		t.Fatalf("first push: %d", s)
	}
	f.outcomes(map[gateway.Outcome]int{gateway.Accepted: 1, gateway.ForwardFailed: 1})
}

func TestFileSinkWithoutLoki(t *testing.T) {
	path := filepath.Join(t.TempDir(), "logs", "nodes.log")
	f := newFixture(t, func(c *gateway.Config) { c.LokiURL = ""; c.FilePath = path })
	node, tok := f.enroll()
	req := batch(f.clock.Now(), lines{`{stream="agent", node_id="liar"}`, []string{"one", "two"}})
	if resp := f.push(tok, lokitest.Body(req)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("push: %d", resp.StatusCode)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 {
		t.Fatalf("file has %d lines: %s", len(lines), data)
	}
	var got struct {
		TS     time.Time         `json:"ts"`
		Labels map[string]string `json:"labels"`
		Line   string            `json:"line"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatal(err)
	}
	if got.Labels["node_id"] != node.String() || got.Labels["stream"] != "agent" || got.Line != "one" || !got.TS.Equal(f.clock.Now()) {
		t.Fatalf("file line %s", lines[0])
	}
	f.outcomes(map[gateway.Outcome]int{gateway.Accepted: 1})
}

func TestHealthAndMetrics(t *testing.T) {
	f := newFixture(t, nil)
	if resp := f.do(http.MethodGet, "/healthz", "", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	resp := f.do(http.MethodGet, "/metrics", "", nil, nil)
	text, _ := io.ReadAll(resp.Body)
	for _, name := range []string{
		`node_log_gateway_batches_total{outcome="accepted"}`,
		`node_log_gateway_batches_total{outcome="rejected_auth"}`,
		`node_log_gateway_batches_total{outcome="rejected_method"}`,
		`node_log_gateway_batches_total{outcome="rejected_size"}`,
		`node_log_gateway_batches_total{outcome="forward_failed"}`,
		"node_log_gateway_forwarded_bytes_total",
		"node_log_gateway_in_flight_requests",
		"node_log_gateway_push_duration_seconds_bucket",
	} {
		if !strings.Contains(string(text), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	problems, err := testutil.GatherAndLint(f.gw.Metrics().Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "node_log_gateway") {
			t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
		}
	}
	f.outcomes(nil) // health and metrics are not batches
}

// The gateway tells what it runs: one build info series with the linked version and the
// commit Go stamped ("unknown" where nothing was stamped or linked).
func TestBuildInfoMetric(t *testing.T) {
	for _, tc := range []struct{ linked, want string }{{"1.4.2", "1.4.2"}, {"", "unknown"}} {
		cfg := gateway.DefaultConfig()
		cfg.FilePath = filepath.Join(t.TempDir(), "logs.jsonl")
		gw, err := gateway.New(cfg, gateway.Options{Version: tc.linked,
			Introspector: gateway.IntrospectorFunc(func(context.Context, string) (uuid.UUID, error) { return uuid.Nil, gateway.ErrUnauthenticated })})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = gw.Close() })
		srv := httptest.NewServer(gw.Handler())
		t.Cleanup(srv.Close)
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var series []string
		for _, line := range strings.Split(string(text), "\n") {
			if strings.HasPrefix(line, gateway.BuildInfoMetric+"{") {
				series = append(series, line)
			}
		}
		b := obs.ReadBuild(tc.linked)
		commit, built := "unknown", "unknown"
		if b.Commit != "" {
			commit, built = b.Commit, b.Time.Format(time.RFC3339)
		}
		want := fmt.Sprintf(`%s{build_time=%q,commit=%q,version=%q} 1`, gateway.BuildInfoMetric, built, commit, tc.want)
		if len(series) != 1 || series[0] != want {
			t.Fatalf("linked %q: build info series %q, want %q", tc.linked, series, want)
		}
		problems, err := testutil.GatherAndLint(gw.Metrics().Registry, gateway.BuildInfoMetric)
		if err != nil || len(problems) != 0 {
			t.Fatalf("lint: %v %v", problems, err)
		}
	}
}

func TestGracefulShutdownDrainsInFlightPush(t *testing.T) {
	f := newFixture(t, nil)
	_, tok := f.enroll()
	f.loki.Script(lokitest.Response{Delay: 300 * time.Millisecond})
	ln, err := listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.gw.Serve(ctx, ln) }()
	status := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+gateway.PushPath,
			bytes.NewReader(lokitest.Body(batch(f.clock.Now(), lines{`{job="x"}`, []string{"l"}}))))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		_ = resp.Body.Close()
		status <- resp.StatusCode
	}()
	if !f.loki.WaitForRequests(1, 5*time.Second) {
		t.Fatal("push never reached loki")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if s := <-status; s != http.StatusNoContent {
		t.Fatalf("in-flight push during shutdown: %d", s)
	}
}

func listen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// Package lokitest is a stand-in for Loki's push endpoint in tests (Loki itself does not
// install here). It decodes the real wire format, protobuf in a snappy block as Loki's
// distributor does, records every push, and answers as scripted (429 with Retry-After,
// 5xx, a slow answer), so gateway and shipper tests see what a real Loki would say.
package lokitest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"

	"github.com/gantry-gpu/gantry/loggateway/gateway"
)

// Response is one scripted answer.
type Response struct {
	Status     int
	RetryAfter string
	// Delay holds the answer back (for forward timeouts).
	Delay time.Duration
}

// Push is one accepted push as Loki would have stored it.
type Push struct {
	Tenant  string
	Streams []Stream
}

// Stream is one decoded stream.
type Stream struct {
	Labels  map[string]string
	Entries []Entry
}

// Entry is one decoded log entry.
type Entry struct {
	Labels   map[string]string
	TS       time.Time
	Line     string
	Metadata map[string]string
}

// Receiver is the fake Loki.
type Receiver struct {
	Server *httptest.Server

	mu       sync.Mutex
	pushes   []Push
	script   []Response
	requests int
	bad      []string
	notify   chan struct{}
}

// New starts a receiver for the test's lifetime.
func New(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{notify: make(chan struct{}, 1)}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.Server.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, b := range r.bad {
			t.Errorf("lokitest: malformed push: %s", b)
		}
	})
	return r
}

// URL is the receiver's base URL (the push path is /loki/api/v1/push).
func (r *Receiver) URL() string { return r.Server.URL }

// Script queues answers for the next pushes; after them, pushes are accepted (204).
func (r *Receiver) Script(resps ...Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.script = append(r.script, resps...)
}

// Requests is the number of push requests received, accepted or not.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// Pushes are the accepted pushes so far.
func (r *Receiver) Pushes() []Push {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Push(nil), r.pushes...)
}

// Entries are every accepted entry, in arrival order.
func (r *Receiver) Entries() []Entry {
	var out []Entry
	for _, p := range r.Pushes() {
		for _, s := range p.Streams {
			out = append(out, s.Entries...)
		}
	}
	return out
}

// Lines are the lines of every accepted entry, sorted.
func (r *Receiver) Lines() []string {
	var out []string
	for _, e := range r.Entries() {
		out = append(out, e.Line)
	}
	sort.Strings(out)
	return out
}

// WaitFor polls until cond holds over the accepted entries or the timeout passes.
func (r *Receiver) WaitFor(timeout time.Duration, cond func([]Entry) bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if cond(r.Entries()) {
			return true
		}
		select {
		case <-r.notify:
		case <-time.After(10 * time.Millisecond):
		case <-deadline.C:
			return cond(r.Entries())
		}
	}
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != gateway.PushPath {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	r.mu.Lock()
	r.requests++
	var resp *Response
	if len(r.script) > 0 {
		resp = &r.script[0]
		r.script = r.script[1:]
	}
	r.mu.Unlock()
	if resp != nil {
		if resp.Delay > 0 {
			select {
			case <-time.After(resp.Delay):
			case <-req.Context().Done():
				return
			}
		}
		if resp.Status != 0 && resp.Status != http.StatusNoContent {
			if resp.RetryAfter != "" {
				w.Header().Set("Retry-After", resp.RetryAfter)
			}
			http.Error(w, "scripted "+strconv.Itoa(resp.Status), resp.Status)
			return
		}
	}
	p, err := decode(req)
	if err != "" {
		r.mu.Lock()
		r.bad = append(r.bad, err)
		r.mu.Unlock()
		http.Error(w, err, http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.pushes = append(r.pushes, p)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}

// decode reads the body as Loki's distributor does for application/x-protobuf.
func decode(req *http.Request) (Push, string) {
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		return Push{}, "content type " + ct
	}
	tenant := req.Header.Get("X-Scope-OrgID")
	if tenant == "" {
		return Push{}, "no X-Scope-OrgID"
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return Push{}, "read: " + err.Error()
	}
	raw, err := snappy.Decode(nil, body)
	if err != nil {
		return Push{}, "snappy: " + err.Error()
	}
	var pr push.PushRequest
	if err := pr.Unmarshal(raw); err != nil {
		return Push{}, "protobuf: " + err.Error()
	}
	p := Push{Tenant: tenant}
	for _, s := range pr.Streams {
		parsed, err := gateway.ParseLabels(s.Labels)
		if err != nil {
			return Push{}, "labels " + s.Labels
		}
		labels := map[string]string{}
		for _, l := range parsed {
			if _, dup := labels[l.Name]; dup {
				return Push{}, "duplicate label " + l.Name
			}
			labels[l.Name] = l.Value
		}
		st := Stream{Labels: labels}
		for _, e := range s.Entries {
			var md map[string]string
			if len(e.StructuredMetadata) > 0 {
				md = map[string]string{}
				for _, m := range e.StructuredMetadata {
					md[m.Name] = m.Value
				}
			}
			// raw is this call's own buffer, so the strings stay valid.
			st.Entries = append(st.Entries, Entry{Labels: labels, TS: e.Timestamp, Line: e.Line, Metadata: md})
		}
		p.Streams = append(p.Streams, st)
	}
	return p, ""
}

// Body encodes req as a push body: protobuf in a snappy block, as Promtail sends it.
func Body(req *push.PushRequest) []byte {
	raw, err := req.Marshal()
	if err != nil {
		panic(err) // a PushRequest always marshals
	}
	return snappy.Encode(nil, raw)
}

// WaitForRequests polls until n push requests have arrived (answered or still being
// answered) or the timeout passes.
func (r *Receiver) WaitForRequests(n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if r.Requests() >= n {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r.Requests() >= n
}

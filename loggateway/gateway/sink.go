package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"

	"github.com/gantry-gpu/gantry/shared/clock"
)

// Sink is where accepted batches go: Loki, or a local file in development.
type Sink interface {
	// Push delivers a stamped batch. raw is its protobuf encoding (the sink may use it or
	// not). An *UpstreamError says how Loki answered.
	Push(ctx context.Context, req *push.PushRequest, raw []byte) error
	Close() error
}

// UpstreamError is a push Loki did not accept.
type UpstreamError struct {
	// Status is Loki's HTTP status; 0 for a transport error or timeout.
	Status int
	// RetryAfter is Loki's Retry-After, when it sent one.
	RetryAfter time.Duration
	Cause      error
}

func (e *UpstreamError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("loki answered %d: %v", e.Status, e.Cause)
	}
	return fmt.Sprintf("loki unreachable: %v", e.Cause)
}

func (e *UpstreamError) Unwrap() error { return e.Cause }

// Loki posts batches to Loki's push endpoint as protobuf in a snappy block.
type Loki struct {
	URL     string
	Tenant  string
	Client  *http.Client
	Timeout time.Duration
	Clock   clock.Clock
	bufs    sync.Pool
}

// NewLoki returns a sink for the push URL, with a connection pool sized for a busy
// gateway.
func NewLoki(url, tenant string, timeout time.Duration) *Loki {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: timeout,
		// Snappy already compresses the body; a gzip layer would only cost CPU.
		DisableCompression: true,
	}
	return &Loki{URL: url, Tenant: tenant, Client: &http.Client{Transport: tr}, Timeout: timeout, Clock: clock.Real{}}
}

func (l *Loki) Push(ctx context.Context, _ *push.PushRequest, raw []byte) error {
	bp, _ := l.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer l.bufs.Put(bp)
	if n := snappy.MaxEncodedLen(len(raw)); cap(*bp) < n {
		*bp = make([]byte, n)
	}
	body := snappy.Encode((*bp)[:cap(*bp)], raw)

	ctx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.URL, bytes.NewReader(body))
	if err != nil {
		return &UpstreamError{Cause: err}
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("X-Scope-OrgID", l.Tenant)
	resp, err := l.Client.Do(req)
	if err != nil {
		return &UpstreamError{Cause: err}
	}
	defer resp.Body.Close()
	// Loki's error text is for our logs only, and only its beginning.
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // keep the connection reusable
	if resp.StatusCode/100 == 2 {
		return nil
	}
	ue := &UpstreamError{Status: resp.StatusCode, Cause: errors.New(string(bytes.TrimSpace(msg)))}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		ue.RetryAfter = parseRetryAfter(ra, l.Clock.Now())
	}
	return ue
}

func (l *Loki) Close() error {
	l.Client.CloseIdleConnections()
	return nil
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when it is neither.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// File appends batches to a local file as JSON lines, one per log entry, for
// development without Loki:
//
//	{"ts":"2026-11-21T06:00:00.123456789Z","labels":{"node_id":"…","stream":"agent"},"line":"…"}
type File struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

// NewFile opens (creating, with its directories) the file at path for appending.
func NewFile(path string) (*File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	return &File{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

type fileLine struct {
	TS       time.Time         `json:"ts"`
	Labels   map[string]string `json:"labels"`
	Line     string            `json:"line"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (f *File) Push(_ context.Context, req *push.PushRequest, _ []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	enc := json.NewEncoder(f.w)
	enc.SetEscapeHTML(false)
	for _, s := range req.Streams {
		parsed, err := ParseLabels(s.Labels)
		if err != nil {
			return err
		}
		labels := make(map[string]string, len(parsed))
		for _, l := range parsed {
			labels[l.Name] = l.Value
		}
		for _, e := range s.Entries {
			var meta map[string]string
			if len(e.StructuredMetadata) > 0 {
				meta = make(map[string]string, len(e.StructuredMetadata))
				for _, m := range e.StructuredMetadata {
					meta[m.Name] = m.Value
				}
			}
			if err := enc.Encode(fileLine{TS: e.Timestamp.UTC(), Labels: labels, Line: e.Line, Metadata: meta}); err != nil {
				return err
			}
		}
	}
	return f.w.Flush()
}

func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.w.Flush()
	return errors.Join(err, f.f.Close())
}

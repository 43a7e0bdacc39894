package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/server"
)

// The answers net/http writes by itself, before any handler (431 for an oversized head,
// 400 for a request line cut off by the read-header timeout or one that cannot be
// parsed, 501 for an unknown transfer coding), are the JSON error envelope on the
// production server (issue 18 item 14). Raw TCP, because a Go client would refuse to
// send most of these.
func TestServerOwnErrorsAreEnvelopes(t *testing.T) {
	e := apitest.New(t)
	srv := server.NewHTTPServer(e.App.Handler, server.HTTPOptions{ReadHeaderTimeout: 300 * time.Millisecond, MaxHeaderBytes: 4 << 10})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(srv, ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()

	cases := []struct {
		name    string
		request string
		status  int
		reason  string
	}{
		{"oversized header", "GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 16<<10) + "\r\n\r\n", 431, "headers_too_large"},
		{"slow client cut off in the request line", "GET /api/v1/hea", 400, "malformed_request"},
		{"no Host header", "GET /api/v1/health HTTP/1.1\r\n\r\n", 400, "malformed_request"},
		{"garbage", "\x16\x03\x01 hello\r\n\r\n", 400, "malformed_request"},
		{"unknown transfer coding", "POST /api/v1/projects HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "unsupported_transfer_encoding"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRoundTrip(t, addr, tc.request)
			checkRawEnvelope(t, resp, body, tc.status, tc.reason)
		})
	}

	t.Run("oversized header on a kept-alive connection", func(t *testing.T) {
		c := dial(t, addr)
		br := bufio.NewReader(c)
		write(t, c, "GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := readResponse(t, br)
		if resp.StatusCode != 200 || !strings.Contains(body, `"ok":true`) {
			t.Fatalf("first request: %d %s", resp.StatusCode, body)
		}
		write(t, c, "GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 16<<10)+"\r\n\r\n")
		resp, body = readResponse(t, br)
		checkRawEnvelope(t, resp, body, 431, "headers_too_large")
	})

	t.Run("handler answers pass untouched", func(t *testing.T) {
		resp, body := rawRoundTrip(t, addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || !strings.Contains(body, "api_http_requests_total") {
			t.Fatalf("metrics: %d %q %.200s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Does not hang: every answer here comes well inside this.
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

func readResponse(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

func rawRoundTrip(t *testing.T, addr, request string) (*http.Response, string) {
	t.Helper()
	c := dial(t, addr)
	write(t, c, request)
	return readResponse(t, bufio.NewReader(c))
}

func checkRawEnvelope(t *testing.T, resp *http.Response, body string, status int, reason string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q: %s", ct, body)
	}
	var env envelope
	if err := json.Unmarshal([]byte(body), &env); err != nil {
		t.Fatalf("not an envelope: %v: %s", err, body)
	}
	if env.Code != "invalid_request" || env.Details["reason"] != reason || env.Message == "" {
		t.Fatalf("envelope %+v, want invalid_request / %s", env, reason)
	}
	if env.CorrelationID == "" || env.CorrelationID != resp.Header.Get("X-Request-Id") {
		t.Fatalf("correlation_id %q, X-Request-Id %q", env.CorrelationID, resp.Header.Get("X-Request-Id"))
	}
	if env.Details["service"] != server.ServiceName {
		t.Fatalf("details.service %v", env.Details["service"])
	}
}

// readFromConn is a real TCP connection that counts the bytes handed to its ReadFrom
// (the path net/http takes to sendfile(2) a file body).
type readFromConn struct {
	*net.TCPConn
	readFrom *atomic.Int64
}

func (c readFromConn) ReadFrom(r io.Reader) (int64, error) {
	n, err := c.TCPConn.ReadFrom(r)
	c.readFrom.Add(n)
	return n, err
}

type readFromListener struct {
	net.Listener
	readFrom *atomic.Int64
}

func (l readFromListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return readFromConn{TCPConn: c.(*net.TCPConn), readFrom: l.readFrom}, nil
}

// A file body served through Serve reaches the connection's own ReadFrom (sendfile on
// TCP) instead of being copied through a buffer by net/http, and arrives intact: the
// envelope connection must not hide the TCP connection's ReadFrom (the storage GET of
// a 1 GiB object depends on it).
func TestServeHandsFileBodiesToTheConnection(t *testing.T) {
	const size = 3<<20 + 17
	content := make([]byte, size)
	for i := range content {
		content[i] = byte(i*7 + i>>9)
	}
	path := filepath.Join(t.TempDir(), "body.bin")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := server.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, io.LimitReader(f, size))
	}), server.HTTPOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var readFrom atomic.Int64
	go func() { _ = server.Serve(srv, readFromListener{Listener: ln, readFrom: &readFrom}) }()
	t.Cleanup(func() { _ = srv.Close() })
	res, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("body: %d bytes, %v; want the file's %d bytes", len(got), err, size)
	}
	// net/http writes the first 512 bytes itself (its content sniffing window), then
	// hands the rest over.
	if n := readFrom.Load(); n != size-512 {
		t.Fatalf("%d of %d body bytes went through the connection's ReadFrom, want all but the first 512", n, size)
	}
}

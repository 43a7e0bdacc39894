package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// HTTPOptions are the HTTP server's limits; zero fields take the defaults below.
type HTTPOptions struct {
	// ReadHeaderTimeout cuts off a client that does not finish its request head.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration
	IdleTimeout time.Duration
	// MaxHeaderBytes caps the request head; above it the answer is 431.
	MaxHeaderBytes int
	Log            *slog.Logger
}

// Defaults of HTTPOptions.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

// NewHTTPServer is the control plane's http.Server. It has no WriteTimeout on purpose:
// the request deadline (RequestTimeout) bounds the work, and a write deadline set when
// the request is read would cut the 503 that the deadline produces, and every
// WebSocket session after it. Serve it with Serve.
func NewHTTPServer(h http.Handler, o HTTPOptions) *http.Server {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		ReadTimeout:       o.ReadTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    o.MaxHeaderBytes,
	}
	if o.Log != nil {
		srv.ErrorLog = slog.NewLogLogger(o.Log.Handler(), slog.LevelWarn)
	}
	return srv
}

// Serve serves srv on ln, through a listener whose connections turn the answers
// net/http writes by itself into the JSON error envelope.
//
// net/http answers some requests before any handler sees them: 431 when the head is
// larger than MaxHeaderBytes, 400 when the request line or a header cannot be parsed
// (a slow client cut off by ReadHeaderTimeout in the middle of its request line lands
// here too), 501 for an unknown transfer coding. It writes those as plain text, in one
// write straight to the connection, with a fixed header block that no handler's
// response has (no Date, Connection before Content-Type is never how net/http orders a
// handler's headers). The connection recognises exactly that write and replaces it with
// the envelope, a fresh correlation id and the same status.
func Serve(srv *http.Server, ln net.Listener) error {
	return srv.Serve(envelopeListener{Listener: ln, maxHeaderBytes: srv.MaxHeaderBytes})
}

type envelopeListener struct {
	net.Listener
	maxHeaderBytes int
}

func (l envelopeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &envelopeConn{Conn: c, maxHeaderBytes: l.maxHeaderBytes}, nil
}

type envelopeConn struct {
	net.Conn
	maxHeaderBytes int
}

// nativeErrorHeaders is the header block of net/http's own error answers.
var nativeErrorHeaders = []byte("\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")

func (c *envelopeConn) Write(p []byte) (int, error) {
	if status, text, ok := nativeError(p); ok {
		if _, err := c.Conn.Write(envelopeResponse(status, text, c.maxHeaderBytes)); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// ReadFrom hands a response body to the connection's own ReadFrom, which for a file
// on a TCP connection is sendfile(2): net/http streams a body through the connection
// only when the connection is an io.ReaderFrom, and without this method every download
// (a 1 GiB object GET) went through a 32 KiB copy buffer, a read and a write per 32 KiB.
// net/http calls it only for a body, after the head went out through Write, so its own
// error answers (written whole by Write before any handler runs) never pass here.
func (c *envelopeConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{c.Conn}, r)
}

// writerOnly hides everything of a writer but Write (io.Copy would otherwise call
// ReadFrom back).
type writerOnly struct{ io.Writer }

// CloseWrite keeps net/http's half-close after a 431 (it waits for the client to read
// the answer before closing).
func (c *envelopeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// nativeError recognises one of net/http's own error answers: "HTTP/1.1 NNN reason",
// the fixed header block, and a short one-line text.
func nativeError(p []byte) (status int, text string, ok bool) {
	const prefix = "HTTP/1.1 "
	if len(p) < len(prefix)+4 || string(p[:len(prefix)]) != prefix {
		return 0, "", false
	}
	line := bytes.IndexByte(p, '\r')
	if line < 0 || !bytes.HasPrefix(p[line:], nativeErrorHeaders) {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(p[len(prefix) : len(prefix)+3]))
	if err != nil || status < 400 || status > 599 {
		return 0, "", false
	}
	body := p[line+len(nativeErrorHeaders):]
	if len(body) > 512 || bytes.ContainsAny(body, "\r\n") {
		return 0, "", false
	}
	return status, string(body), true
}

// envelopeResponse is the whole HTTP answer for one of net/http's own errors.
func envelopeResponse(status int, text string, maxHeaderBytes int) []byte {
	var e *apierr.Error
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		e = apierr.New(apierr.InvalidRequest, "request headers are larger than %d bytes", maxHeaderBytes).
			With("reason", "headers_too_large")
	case http.StatusNotImplemented:
		e = apierr.New(apierr.InvalidRequest, "unsupported transfer encoding").With("reason", "unsupported_transfer_encoding")
	default:
		// "400 Bad Request" or net/http's "NNN Reason: detail" (missing Host header, an
		// unsupported protocol version, ...): the detail is net/http's fixed wording.
		msg := "the request could not be parsed"
		if _, detail, found := bytes.Cut([]byte(text), []byte(": ")); found {
			msg += ": " + string(detail)
		}
		e = apierr.New(apierr.InvalidRequest, "%s", msg).With("reason", "malformed_request")
	}
	e.WithStatus(status)
	id := correlation.NewID()
	r := (&http.Request{}).WithContext(correlation.WithID(context.Background(), id))
	_, env := apierr.Writer{Service: ServiceName}.Envelope(r, e)
	body, _ := json.Marshal(env)
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n%s: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), correlation.HeaderRequestID, id, len(body), body)
}

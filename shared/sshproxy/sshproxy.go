// Package sshproxy is the core of `gantry ssh-proxy`, the OpenSSH ProxyCommand that
// carries one SSH connection to an allocation through the control plane and the node's
// tunnel (docs/ssh.md): it mints a single-use token (POST
// /api/v1/allocations/{id}/ssh-sessions, public API, generated client), opens the
// WebSocket /ws/ssh/{id} offering the token as a subprotocol (never in the URL), and
// copies stdin to the WebSocket and the WebSocket to stdout until either ends. SSH
// itself (keys, host key, encryption) stays end to end between the client and the
// allocation's SSH server.
package sshproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/proto/api"
)

// Subprotocol is the SSH byte-stream protocol of /ws/ssh.
const Subprotocol = "gantry.ssh.v1"

// stdinGrace is how long the stream stays open after stdin ends.
const stdinGrace = 2 * time.Second

// chunk is the most one WebSocket message carries (the server reads up to 1 MiB). It is
// larger than a pipe holds (64 KiB), so one read takes everything ssh has written: at
// 32 KiB, an SSH packet of 32 KiB of data plus its framing went out as a 32 KiB message
// and a sliver of a few dozen bytes, and every hop after (WebSocket, yamux frame, TLS
// record, write) paid for the sliver as for a whole message.
const chunk = 128 << 10

// Options say which allocation to reach and how to call the API.
type Options struct {
	// BaseURL is the control plane's URL ("https://gantry.example.com").
	BaseURL string
	// HTTPClient carries the calls and the WebSocket handshake (nil: http.DefaultClient).
	HTTPClient *http.Client
	// Bearer returns the access token for the token mint (the CLI refreshes it here).
	Bearer func(ctx context.Context) (string, error)
	// ProjectID is the allocation's project (X-Project-ID).
	ProjectID uuid.UUID
	// AllocationID is the allocation to reach.
	AllocationID uuid.UUID
}

// Error is the API's refusal: the ErrorResponse code, message and correlation id.
type Error struct {
	Status        int
	Code          string
	Message       string
	CorrelationID string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s (code %s", e.Message, e.Code)
	if e.CorrelationID != "" {
		s += ", correlation id " + e.CorrelationID
	}
	return s + ")"
}

// Dial mints a token and opens the allocation's SSH byte stream; the returned
// connection carries the SSH protocol's bytes. ctx bounds the opening only.
func Dial(ctx context.Context, o Options) (net.Conn, error) {
	hc := o.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	base := strings.TrimRight(o.BaseURL, "/")
	c, err := api.NewClientWithResponses(base, api.WithHTTPClient(hc), api.WithRequestEditorFn(func(ctx context.Context, req *http.Request) error {
		if o.Bearer == nil {
			return nil
		}
		tok, err := o.Bearer(ctx)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		return nil
	}))
	if err != nil {
		return nil, err
	}
	res, err := c.CreateSSHSessionWithResponse(ctx, o.AllocationID, &api.CreateSSHSessionParams{XProjectID: o.ProjectID})
	if err != nil {
		return nil, fmt.Errorf("ssh token: %w", err)
	}
	if res.JSON201 == nil {
		return nil, apiError(res.StatusCode(), res.HTTPResponse.Header, res.Body)
	}
	sess := res.JSON201
	u, err := url.Parse(base + sess.WebsocketPath)
	if err != nil {
		return nil, err
	}
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	}
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: hc, Subprotocols: sess.Subprotocols})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			return nil, apiError(resp.StatusCode, resp.Header, body)
		}
		return nil, fmt.Errorf("ssh stream: %w", err)
	}
	if ws.Subprotocol() != Subprotocol {
		_ = ws.CloseNow()
		return nil, errors.New("ssh stream: the server did not speak " + Subprotocol)
	}
	ws.SetReadLimit(1 << 20)
	// The connection outlives the dial's context.
	return websocket.NetConn(context.WithoutCancel(ctx), ws, websocket.MessageBinary), nil
}

func apiError(status int, h http.Header, body []byte) error {
	var env api.ErrorResponse
	e := &Error{Status: status, Code: fmt.Sprintf("http_%d", status), Message: http.StatusText(status)}
	if json.Unmarshal(body, &env) == nil && env.Code != "" {
		e.Code, e.Message, e.CorrelationID = string(env.Code), env.Message, env.CorrelationID
	}
	if e.CorrelationID == "" && h != nil {
		e.CorrelationID = h.Get("X-Request-Id")
	}
	return e
}

// Run is `gantry ssh-proxy`: Dial, then copy stdin to the stream and the stream to
// stdout until the SSH connection ends (the server closes the stream, or stdin ends
// and the server finishes). Cancelling ctx ends it.
func Run(ctx context.Context, o Options, stdin io.Reader, stdout io.Writer) error {
	conn, err := Dial(ctx, o)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	up := make(chan error, 1)
	go func() {
		buf := make([]byte, chunk)
		_, err := io.CopyBuffer(conn, stdin, buf)
		up <- err
	}()
	// The SSH server ends the connection after the client's disconnect, so the stream's
	// end is normally the session's end. The end of stdin is the client's: ssh closes
	// its ProxyCommand's stdin only when it exits, so nothing will read what the server
	// still sends; after a short grace for the server's last bytes, the stream is
	// closed, so a killed client never leaves a proxy (and a connection) behind.
	down := make(chan error, 1)
	go func() {
		buf := make([]byte, chunk)
		_, err := io.CopyBuffer(stdout, conn, buf)
		down <- err
	}()
	select {
	case err = <-down:
	case <-up:
		select {
		case err = <-down:
		case <-time.After(stdinGrace):
			_ = conn.Close()
			<-down
			err = nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil && !isClosed(err) {
		return fmt.Errorf("ssh stream: %w", err)
	}
	return nil
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		websocket.CloseStatus(err) == websocket.StatusNormalClosure
}

package terminal

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/termproto"
)

// Wire names.
const (
	// Subprotocol is the terminal protocol; the only subprotocol the server echoes.
	Subprotocol = "gantry.terminal.v1"
	// TokenSubprotocolPrefix carries the token: "gantry.token.<token>".
	TokenSubprotocolPrefix = "gantry.token."
	// RouteTerminal and RouteRelay are the operations' paths (details.route).
	RouteTerminal = "/ws/terminal/{allocation_id}"
	RouteRelay    = "/api/v1/internal/terminal/relay/{allocation_id}"
	// Term is the TERM the agent gives the PTY.
	Term = "xterm-256color"
	// maxClientMessage bounds one message from the browser (input or control): a large
	// paste fits; a larger message closes the WebSocket (1009) and detaches.
	maxClientMessage = 1 << 20
)

// ServiceName goes into the details.service of envelopes sent as error frames.
const ServiceName = "gantry-controlplane"

var envelopes = apierr.Writer{Service: ServiceName}

// StrictMiddleware is an api.StrictMiddlewareFunc serving the two WebSocket operations:
// the generated strict server cannot hand a handler the connection, so the upgrade
// happens here and the generated handler is never called. A nil response after an
// upgrade tells the strict server that the request was answered. Mount it in
// server.Deps.StrictMiddlewares.
func (s *Service) StrictMiddleware(f api.StrictHandlerFunc, operationID string) api.StrictHandlerFunc {
	switch operationID {
	case "CreateTerminalSession":
		return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
			// The response carries a secret.
			w.Header().Set("Cache-Control", "no-store")
			return f(ctx, w, r, request)
		}
	case "OpenTerminal":
		return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
			req, _ := request.(api.OpenTerminalRequestObject)
			if err := s.openTerminal(ctx, w, r, req.AllocationID); err != nil {
				return nil, s.refused(w, r, terminalEndpoint, err)
			}
			return nil, nil
		}
	case "CreateSSHSession":
		return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
			w.Header().Set("Cache-Control", "no-store")
			return f(ctx, w, r, request)
		}
	case "OpenSSH":
		return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
			req, _ := request.(api.OpenSSHRequestObject)
			if err := s.openSSH(ctx, w, r, req.AllocationID); err != nil {
				return nil, s.refused(w, r, sshEndpoint, err)
			}
			return nil, nil
		}
	case "RelayTerminal":
		return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
			req, _ := request.(api.RelayTerminalRequestObject)
			if err := s.serveRelay(ctx, w, r, req.AllocationID); err != nil {
				return nil, s.refused(w, r, relayEndpoint, err)
			}
			return nil, nil
		}
	}
	return f
}

// withRoute adds the route and method to a pre-upgrade error (seed §7.1 rule 2).
func withRoute(err error, route, method string) *apierr.Error {
	e, ok := apierr.As(err)
	if !ok {
		e = apierr.Internal(err)
	}
	return e.With("route", route).With("method", method)
}

// admit is the handshake every WebSocket byte stream into an allocation (terminal, SSH)
// passes before the upgrade: no token in the query, an upgrade request from an allowed
// origin, the single-use token in the subprotocol list spent, and the allocation running.
// what names the streams in the origin refusal ("terminals"), needs starts the
// not-running message ("a terminal needs").
func (s *Service) admit(ctx context.Context, r *http.Request, allocationID uuid.UUID, subprotocol, what, needs string) (Grant, Allocation, error) {
	if err := s.refuseQueryToken(ctx, r); err != nil {
		return Grant{}, Allocation{}, err
	}
	if !isUpgrade(r) {
		return Grant{}, Allocation{}, apierr.New(apierr.InvalidRequest, "this is a WebSocket endpoint: send an upgrade request").
			With("reason", "websocket_upgrade_required")
	}
	if !s.originAllowed(r) {
		return Grant{}, Allocation{}, apierr.New(apierr.InvalidRequest, "this origin may not open %s", what).
			With("reason", "origin_not_allowed").WithStatus(http.StatusForbidden)
	}
	tok, err := tokenFromSubprotocols(r, subprotocol)
	if err != nil {
		return Grant{}, Allocation{}, err
	}
	grant, err := s.Consume(ctx, tok, allocationID)
	if err != nil {
		return Grant{}, Allocation{}, err
	}
	alloc, err := s.deps.Allocations.Allocation(ctx, grant.ProjectID, allocationID)
	if err != nil {
		return Grant{}, Allocation{}, err
	}
	if !running(alloc.Status) {
		return Grant{}, Allocation{}, apierr.New(apierr.AllocationNotActive, "%s a running allocation; this one is %s", needs, alloc.Status).
			With("status", alloc.Status)
	}
	return grant, alloc, nil
}

// openTerminal checks the handshake, spends the token, opens the stream to the agent
// (here or through the replica holding the node's tunnel), upgrades and bridges until
// the session ends or detaches. Errors are returned only before the upgrade.
func (s *Service) openTerminal(ctx context.Context, w http.ResponseWriter, r *http.Request, allocationID uuid.UUID) error {
	grant, alloc, err := s.admit(ctx, r, allocationID, Subprotocol, "terminals", "a terminal needs")
	if err != nil {
		return err
	}

	// The session outlives the request's context handling; it keeps its values
	// (correlation id, trace) and gains the token's user as the principal for audit.
	bctx, cancel := context.WithCancel(principal.With(context.WithoutCancel(ctx), &principal.Principal{
		UserID: grant.UserID, TenantID: grant.TenantID,
	}))
	defer cancel()
	octx, ocancel := context.WithTimeout(bctx, s.cfg.OpenTimeout)
	st, err := s.openStream(octx, bctx, alloc, grant)
	ocancel()
	if err != nil {
		return err
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}, OriginPatterns: s.cfg.AllowedOrigins})
	if err != nil {
		// Accept has answered the request itself.
		abandon(st, grant.Reattach)
		s.deps.Log.WarnContext(ctx, "terminal: websocket accept failed", "err", err)
		return nil
	}
	ws.SetReadLimit(maxClientMessage)
	b := newBridge(s, bctx, r, ws, st, grant, alloc)
	if !s.track(b) {
		b.refuse(apierr.New(apierr.ServiceUnavailable, "the control plane is shutting down; reconnect"))
		return nil
	}
	defer s.untrack(b)
	b.run()
	return nil
}

// refuseQueryToken refuses a request carrying anything token-like in its query string
// (seed §5 rule 6), and spends such a token: a URL ends up in logs and histories. The
// value is never logged.
func (s *Service) refuseQueryToken(ctx context.Context, r *http.Request) error {
	if r.URL.RawQuery == "" {
		return nil
	}
	found := false
	for k, vs := range r.URL.Query() {
		if !strings.Contains(strings.ToLower(k), "token") {
			continue
		}
		found = true
		for _, v := range vs {
			s.burn(ctx, strings.TrimPrefix(v, TokenSubprotocolPrefix))
		}
	}
	if !found {
		return nil
	}
	return apierr.New(apierr.InvalidRequest, "terminal tokens are never accepted in a URL; offer the subprotocol %s<token>", TokenSubprotocolPrefix).
		With("reason", "token_in_query")
}

func isUpgrade(r *http.Request) bool {
	return headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// originAllowed: no Origin (not a browser), this host, or an allowed pattern; the same
// rule websocket.Accept applies with OriginPatterns, checked first so that a refusal is
// an envelope.
func (s *Service) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(r.Host, u.Host) {
		return true
	}
	for _, p := range s.cfg.AllowedOrigins {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(strings.ToLower(p), strings.ToLower(target)); err == nil && ok {
			return true
		}
	}
	return false
}

// tokenFromSubprotocols finds the token among the offered subprotocols; the client must
// also offer the endpoint's own protocol (want: the terminal's or SSH's).
func tokenFromSubprotocols(r *http.Request, want string) (string, error) {
	var tokens []string
	terminal := false
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			switch {
			case p == want:
				terminal = true
			case strings.HasPrefix(p, TokenSubprotocolPrefix):
				tokens = append(tokens, strings.TrimPrefix(p, TokenSubprotocolPrefix))
			}
		}
	}
	switch {
	case len(tokens) == 0:
		return "", apierr.New(apierr.TokenMissing, "offer the terminal token as the subprotocol %s<token>", TokenSubprotocolPrefix)
	case len(tokens) > 1:
		return "", apierr.New(apierr.TokenInvalid, "offer exactly one terminal token")
	case !terminal:
		return "", apierr.New(apierr.InvalidRequest, "offer the subprotocol %s", want).With("reason", "subprotocol_required")
	}
	return tokens[0], nil
}

// preamble is the stream preamble of a grant's session.
func preamble(ctx context.Context, alloc Allocation, g Grant) *fabricv1.StreamPreamble {
	return &fabricv1.StreamPreamble{
		Kind: fabricv1.StreamKind_STREAM_KIND_TERMINAL, StreamId: g.SessionID.String(), AllocationId: alloc.ID.String(),
		TerminalSize: &fabricv1.TerminalSize{Cols: uint32(g.Cols), Rows: uint32(g.Rows)}, Term: Term,
		CorrelationId: correlation.ID(ctx),
	}
}

// openStream opens the session's terminal stream: straight to the agent when this
// replica holds the node's tunnel, else through the holder (relay.go). octx bounds the
// opening; the relayed connection lives on bctx.
func (s *Service) openStream(octx, bctx context.Context, alloc Allocation, g Grant) (net.Conn, error) {
	return s.openRaw(octx, bctx, alloc, preamble(octx, alloc, g))
}

// openRaw opens a raw stream with preamble pre to the allocation's node, here or
// through the replica holding its tunnel (terminal and SSH streams alike).
func (s *Service) openRaw(octx, bctx context.Context, alloc Allocation, pre *fabricv1.StreamPreamble) (net.Conn, error) {
	st, err := s.deps.Fabric.OpenStream(octx, alloc.NodeID, pre)
	var elsewhere *fabric.NotHeldHereError
	if errors.As(err, &elsewhere) {
		return s.dialRelay(octx, bctx, elsewhere.Replica, alloc.NodeID, pre)
	}
	if err != nil {
		return nil, openError(octx, err)
	}
	return st, nil
}

// openError maps a failure to open the agent's stream onto the contract's codes.
func openError(ctx context.Context, err error) error {
	var refused *fabricnet.StreamRefusedError
	switch {
	case errors.Is(err, fabric.ErrNodeOffline):
		return apierr.New(apierr.NodeOffline, "the allocation's node is offline").Wrap(err)
	case errors.As(err, &refused):
		return refusedError(refused.Code)
	case ctx.Err() != nil:
		return apierr.New(apierr.UpstreamError, "the node did not answer in time").With("reason", "timeout").Wrap(err)
	}
	return apierr.New(apierr.UpstreamError, "the terminal stream to the node could not be opened").Wrap(err)
}

// refusedError maps the agent's refusal of a terminal stream. The agent's message is
// not passed on (it may carry host details); its code is.
func refusedError(code string) error {
	switch code {
	case "session_not_found", "session_ended":
		return apierr.New(apierr.InvalidRequest, "the terminal session no longer exists on the node").
			With("reason", "session_ended").WithStatus(http.StatusConflict)
	}
	return apierr.New(apierr.UpstreamError, "the node refused the terminal").With("agent_error_code", code)
}

// abandon ends a stream nobody will bridge: a session the stream just started is
// closed (nobody ever saw it), one it reattached to is detached again.
func abandon(st net.Conn, reattach bool) {
	typ := termproto.TypeClose
	if reattach {
		typ = termproto.TypeDetach
	}
	_ = st.SetWriteDeadline(time.Now().Add(time.Second))
	_ = termproto.WriteControl(st, termproto.Control{Type: typ})
	_ = st.Close()
}

package notifications

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/redact"
)

const (
	// Subprotocol is the message format of /ws/notifications; a client must offer it,
	// and it is the only subprotocol the server echoes.
	Subprotocol = "gantry.notifications.v1"
	// BearerProtocolPrefix carries the access token from browsers, which cannot set
	// Authorization on a WebSocket: the subprotocol "gantry.bearer.<token>".
	BearerProtocolPrefix = "gantry.bearer."
	// Route is the operation's path (in error details, seed §7.1 rule 2).
	Route = "/ws/notifications"
	// operationID is the generated strict server's name of the operation.
	operationID = "ConnectNotifications"
)

// TokenVerifier checks an access token: auth.Authenticator.Verify.
type TokenVerifier interface {
	Verify(ctx context.Context, token string) (*principal.Principal, error)
}

// Handlers is this package's slice of the generated strict-server interface, and the
// strict middleware that performs the upgrade.
type Handlers struct {
	Hub    *Hub
	Tokens TokenVerifier
	// Denials audits the refusals (401, 403), which are answered here rather than by
	// the server's error mapper (denials.go); nil audits none.
	Denials DenialRecorder
	Log     *slog.Logger
}

// NewHandlers serves GET /ws/notifications from hub, authenticating with tokens and
// auditing refusals in denials.
func NewHandlers(hub *Hub, tokens TokenVerifier, denials DenialRecorder, log *slog.Logger) *Handlers {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handlers{Hub: hub, Tokens: tokens, Denials: denials, Log: log}
}

// ConnectNotifications is only reached when StrictMiddleware is not installed: the
// upgrade needs the raw connection, which a strict handler never sees.
func (h *Handlers) ConnectNotifications(context.Context, api.ConnectNotificationsRequestObject) (api.ConnectNotificationsResponseObject, error) {
	return nil, routed(apierr.New(apierr.ServiceUnavailable, "notifications are not available on this server"), http.MethodGet)
}

// StrictMiddleware performs the WebSocket upgrade of ConnectNotifications: the generated
// strict server hands middlewares the ResponseWriter and request, and accepts a nil
// response once the connection has been hijacked. The contract declares the operation
// with its own scheme (websocketBearerAuth), which the request chain does not check:
// the token may travel in a subprotocol, so it is checked here, before the upgrade.
func (h *Handlers) StrictMiddleware(f api.StrictHandlerFunc, op string) api.StrictHandlerFunc {
	if op != operationID {
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		if h == nil || h.Hub == nil || h.Tokens == nil {
			return f(ctx, w, r, request)
		}
		switch err := h.connect(w, r); {
		case errors.Is(err, errAnswered):
			return nil, nil
		case err != nil:
			return nil, h.refused(w, r, err)
		}
		return nil, nil // upgraded: the connection is the hub's now
	}
}

// errAnswered: the WebSocket library has already written the response.
var errAnswered = errors.New("notifications: response already written")

// connect checks everything that can be refused with an envelope, in order, then
// upgrades and hands the connection to the hub.
func (h *Handlers) connect(w http.ResponseWriter, r *http.Request) error {
	if r.URL.RawQuery != "" {
		return queryRefused(r.URL.RawQuery)
	}
	if !originAllowed(r, h.Hub.cfg.AllowedOrigins) {
		return apierr.Forbidden("this origin may not open notification sockets").With("reason", "origin_not_allowed")
	}
	if err := checkHandshake(w, r); err != nil {
		return err
	}
	token, err := credential(r)
	if err != nil {
		return err
	}
	p, err := h.Tokens.Verify(r.Context(), token)
	if err != nil {
		return err
	}
	s, err := h.Hub.attach(p, tokenExpiry(token))
	switch {
	case errors.Is(err, errTooManyConn):
		return apierr.New(apierr.RateLimitExceeded, "you have %d notification sockets open on this server already", h.Hub.cfg.MaxConnectionsPerUser).
			With("reason", "too_many_connections").With("limit", h.Hub.cfg.MaxConnectionsPerUser)
	case err != nil:
		return apierr.New(apierr.ServiceUnavailable, "notifications are shutting down on this server").Wrap(err)
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{Subprotocol},
		// Already checked above with the same patterns; the library checks again.
		OriginPatterns: h.Hub.cfg.AllowedOrigins,
	})
	if err != nil {
		h.Hub.abandon(s)
		h.Log.WarnContext(r.Context(), "notifications: upgrade failed", "err", err)
		return errAnswered
	}
	h.Hub.start(s, conn)
	return nil
}

// routed adds the route and method to an error's details (seed §7.1 rule 2) without
// touching the error it was given (authentication errors may be shared).
func routed(err error, method string) error {
	e, ok := apierr.As(err)
	if !ok {
		e = apierr.Internal(err)
	}
	c := *e
	c.Details = make(map[string]any, len(e.Details)+2)
	for k, v := range e.Details {
		c.Details[k] = v
	}
	c.Details["route"], c.Details["method"] = Route, method
	return &c
}

// queryRefused: this operation takes no query parameters, and a token in a URL ends up in
// proxy and browser logs. The query itself is never echoed or logged.
func queryRefused(raw string) error {
	reason := "query_not_allowed"
	q, _ := url.ParseQuery(raw) // what parsed, even from a malformed query
	for k := range q {
		if looksLikeCredential(k) {
			reason = "token_in_query"
			break
		}
	}
	return apierr.New(apierr.InvalidRequest,
		"send the access token in the Authorization header or as the %s<token> subprotocol, never in the URL", BearerProtocolPrefix).
		With("reason", reason)
}

func looksLikeCredential(key string) bool {
	k := strings.ToLower(key)
	return redact.IsSecretField(k) || k == "jwt" || k == "bearer" || k == "auth" || k == "access"
}

// originAllowed: no Origin (not a browser) or the request's own host is allowed; any
// other origin must match a configured pattern (host, or scheme://host, path.Match).
func originAllowed(r *http.Request, patterns []string) bool {
	values := r.Header.Values("Origin")
	if len(values) == 0 {
		return true
	}
	if len(values) > 1 {
		return false
	}
	u, err := url.Parse(values[0])
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	for _, p := range patterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(p, strings.ToLower(target)); err == nil && ok {
			return true
		}
	}
	return false
}

// checkHandshake refuses, with an envelope, what the WebSocket library would refuse
// with plain text.
func checkHandshake(w http.ResponseWriter, r *http.Request) error {
	bad := func(what string) error {
		return apierr.New(apierr.InvalidRequest, "not a WebSocket handshake: %s", what).With("reason", "websocket_handshake_required")
	}
	switch {
	case !r.ProtoAtLeast(1, 1):
		return bad("HTTP/1.1 or later is required")
	case !hasToken(r.Header, "Connection", "upgrade"):
		return bad("Connection must include Upgrade")
	case !hasToken(r.Header, "Upgrade", "websocket"):
		return bad("Upgrade must be websocket")
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		w.Header().Set("Sec-WebSocket-Version", "13")
		return bad("Sec-WebSocket-Version must be 13")
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return bad("exactly one Sec-WebSocket-Key is required")
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
		return bad("Sec-WebSocket-Key must be 16 bytes in base64")
	}
	return nil
}

// credential finds the access token: the Authorization header or one
// gantry.bearer.<token> subprotocol, not both; gantry.notifications.v1 must be offered.
func credential(r *http.Request) (string, error) {
	offered, fromProtocol := false, []string{}
	for _, p := range tokens(r.Header, "Sec-WebSocket-Protocol") {
		switch {
		case strings.EqualFold(p, Subprotocol):
			offered = true
		case strings.HasPrefix(p, BearerProtocolPrefix):
			fromProtocol = append(fromProtocol, strings.TrimPrefix(p, BearerProtocolPrefix))
		}
	}
	if !offered {
		return "", apierr.New(apierr.InvalidRequest, "offer the %s subprotocol", Subprotocol).With("reason", "subprotocol_required")
	}
	header, found, err := auth.BearerToken(r)
	if err != nil {
		return "", err
	}
	switch {
	case len(fromProtocol) > 1 || (found && len(fromProtocol) == 1):
		return "", apierr.New(apierr.InvalidRequest, "send the access token once: in Authorization or in one %s<token> subprotocol", BearerProtocolPrefix).
			With("reason", "credentials_ambiguous")
	case found:
		return header, nil
	case len(fromProtocol) == 1 && fromProtocol[0] != "":
		return fromProtocol[0], nil
	case len(fromProtocol) == 1:
		return "", apierr.New(apierr.TokenInvalid, "access token is invalid")
	}
	return "", apierr.New(apierr.TokenMissing, "authentication required: send the access token in the Authorization header or as the %s<token> subprotocol", BearerProtocolPrefix)
}

// tokens splits the comma-separated values of header name.
func tokens(h http.Header, name string) []string {
	var out []string
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}

func hasToken(h http.Header, name, token string) bool {
	for _, t := range tokens(h, name) {
		if strings.EqualFold(t, token) {
			return true
		}
	}
	return false
}

// tokenExpiry reads exp from a token that Verify has already accepted (so its payload
// is ours and well-formed); zero when it cannot be read.
func tokenExpiry(token string) time.Time {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if json.Unmarshal(raw, &claims) != nil {
		return time.Time{}
	}
	secs, err := claims.Exp.Int64()
	if err != nil || secs <= 0 {
		return time.Time{}
	}
	return time.Unix(secs, 0)
}

package terminal

import (
	"context"
	"errors"
	"strings"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the terminal slice of api.StrictServerInterface. The two
// WebSocket operations are served by Service.StrictMiddleware, which takes the
// connection before the generated handler would run; their strict methods are reached
// only if that middleware is not mounted.
type Handlers struct {
	Svc *Service
}

var errNoMiddleware = errors.New("terminal: the WebSocket operations need terminal.Service.StrictMiddleware mounted")

// CreateTerminalSession implements POST /api/v1/allocations/{allocation_id}/terminal-sessions.
func (h *Handlers) CreateTerminalSession(ctx context.Context, req api.CreateTerminalSessionRequestObject) (api.CreateTerminalSessionResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
			With("field", "X-Project-ID").With("reason", "project_context_missing")
	}
	var mr MintRequest
	if b := req.Body; b != nil {
		if b.SessionID != nil {
			mr.SessionID = uuid.NullUUID{UUID: *b.SessionID, Valid: true}
		}
		if b.Cols != nil {
			mr.Cols = *b.Cols
		}
		if b.Rows != nil {
			mr.Rows = *b.Rows
		}
	}
	m, err := h.Svc.Mint(ctx, p, proj, req.AllocationID, mr)
	if err != nil {
		return nil, err
	}
	return api.CreateTerminalSession201JSONResponse{Body: api.TerminalSession{
		Token: m.Token, SessionID: m.SessionID, AllocationID: req.AllocationID, Reattach: m.Reattach,
		ExpiresAt:     m.ExpiresAt,
		WebsocketPath: strings.Replace(RouteTerminal, "{allocation_id}", req.AllocationID.String(), 1),
		Subprotocols:  []string{Subprotocol, TokenSubprotocolPrefix + m.Token},
	}}, nil
}

// OpenTerminal is GET /ws/terminal/{allocation_id}; Service.StrictMiddleware serves it.
func (h *Handlers) OpenTerminal(context.Context, api.OpenTerminalRequestObject) (api.OpenTerminalResponseObject, error) {
	return nil, errNoMiddleware
}

// RelayTerminal is GET /api/v1/internal/terminal/relay/{allocation_id};
// Service.StrictMiddleware serves it.
func (h *Handlers) RelayTerminal(context.Context, api.RelayTerminalRequestObject) (api.RelayTerminalResponseObject, error) {
	return nil, errNoMiddleware
}

package proxy

import (
	"context"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the proxy's slice of api.StrictServerInterface (the InternalAppProxy
// tag): createAppProxySession. The proxy itself is not an operation of the contract;
// mount it with Service.Mount.
type Handlers struct {
	Svc *Service
}

// Handlers returns the strict-server handlers of the proxy.
func (s *Service) Handlers() *Handlers { return &Handlers{Svc: s} }

// CreateAppProxySession implements POST /api/v1/app-instances/{app_instance_id}/proxy-sessions.
func (h *Handlers) CreateAppProxySession(ctx context.Context, req api.CreateAppProxySessionRequestObject) (api.CreateAppProxySessionResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	proj, ok := projectctx.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
			With("field", "X-Project-ID").With("reason", "project_context_missing")
	}
	s, err := h.Svc.Mint(ctx, p, proj, req.AppInstanceID)
	if err != nil {
		return nil, err
	}
	return api.CreateAppProxySession201JSONResponse{Body: api.AppProxySession{
		AppInstanceID: s.InstanceID, URL: s.URL, ExpiresAt: s.ExpiresAt,
	}}, nil
}

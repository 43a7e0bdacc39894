package server

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/bearer"
	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// denials is the one place where a refused request (401 or 403, whichever layer
// refused it: the bearer or node-token check, the project check, a handler) is
// answered with its challenge and counted for the audit log. The error mapper calls it
// for every error it writes, so no path can deny without being audited.
type denials struct {
	audit    *audit.Denials // nil: denials are not audited (handler tests)
	mux      *chi.Mux
	contract *contract.Contract
}

// deny adds the challenge of a 401 and hands the denial to the audit aggregator
// (memory only: a denial never waits on the database).
func (d *denials) deny(w http.ResponseWriter, r *http.Request, err error, status int) {
	if status != http.StatusUnauthorized && status != http.StatusForbidden {
		return
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", bearer.Challenge(bearer.InAuthorization(r)))
	}
	if d == nil || d.audit == nil {
		return
	}
	d.audit.Observe(d.describe(r, err, status))
}

// describe is what the audit row says about a denial: the actor if authenticated, the
// operation (path template, never the raw path), the code, the correlation id, the
// client address and the project the request named.
func (d *denials) describe(r *http.Request, err error, status int) audit.Denial {
	ctx := r.Context()
	den := audit.Denial{
		ActorType:     audit.ActorUser,
		IP:            ratelimit.ClientIP(r),
		Method:        r.Method,
		Route:         "unmatched",
		Code:          string(apierr.CodeOf(err)),
		Status:        status,
		CorrelationID: correlation.ID(ctx),
	}
	rctx := chi.NewRouteContext()
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	if op := d.contract.Op(r.Method, d.mux.Find(rctx, r.Method, path)); op != nil {
		den.Route, den.OperationID = op.Path, op.ID
		if op.Security == contract.SecurityNode {
			den.ActorType = audit.ActorNode
		}
	}
	if p, ok := principal.From(ctx); ok {
		den.ActorUserID, den.TenantID = p.UserID, p.TenantID
	}
	if proj, ok := projectctx.From(ctx); ok {
		den.ProjectID = proj.ID
	} else if id, err := uuid.Parse(rctx.URLParam("project_id")); err == nil {
		den.ProjectID = id
	} else if id, err := uuid.Parse(strings.TrimSpace(r.Header.Get("X-Project-ID"))); err == nil {
		den.ProjectID = id
	}
	return den
}

package readmodels

import (
	"context"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"strings"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// GetV3ShellContext implements GET /api/v1/v3/shell/context.
func (h *Handlers) GetV3ShellContext(ctx context.Context, req api.GetV3ShellContextRequestObject) (api.GetV3ShellContextResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	var project *projectctx.Project
	if pc, ok := projectctx.From(ctx); ok {
		project = &pc
	}
	mode := ""
	if req.Params.Mode != nil {
		mode = string(*req.Params.Mode)
	}
	bypass := req.Params.CacheControl != nil && noCache(*req.Params.CacheControl)
	c, err := h.Svc.ShellContext(ctx, p, project, mode, bypass)
	if err != nil {
		return nil, err
	}
	return api.GetV3ShellContext200JSONResponse{Body: api.V3ShellContextResponse{Context: c}}, nil
}

// noCache reports whether a Cache-Control header asks for a fresh answer.
func noCache(v string) bool {
	for _, d := range strings.Split(v, ",") {
		d = strings.ToLower(strings.TrimSpace(d))
		if d == "no-cache" || d == "no-store" || strings.HasPrefix(d, "max-age=0") {
			return true
		}
	}
	return false
}

// PutV3NotificationReadMarker implements PUT /api/v1/v3/notifications/read-marker.
func (h *Handlers) PutV3NotificationReadMarker(ctx context.Context, req api.PutV3NotificationReadMarkerRequestObject) (api.PutV3NotificationReadMarkerResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "a JSON body is required")
	}
	at, unread, err := h.Svc.MarkRead(ctx, p, req.Body.ReadThrough)
	if err != nil {
		return nil, err
	}
	return api.PutV3NotificationReadMarker200JSONResponse{Body: api.V3NotificationReadMarker{ReadThrough: at, UnreadNotifications: unread}}, nil
}

// ListV3Workloads implements GET /api/v1/v3/workloads.
func (h *Handlers) ListV3Workloads(ctx context.Context, req api.ListV3WorkloadsRequestObject) (api.ListV3WorkloadsResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	pc, ok := projectctx.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
			With("field", "X-Project-ID").With("reason", "project_context_missing")
	}
	pr := req.Params
	f := Filter{Sort: SortCreatedDesc, NeedsAction: pr.NeedsAction}
	if pr.Sort != nil {
		f.Sort = string(*pr.Sort)
	}
	if pr.Status != nil {
		f.Status = string(*pr.Status)
	}
	if pr.Kind != nil {
		f.Kind = string(*pr.Kind)
	}
	if pr.Scope != nil && *pr.Scope != "all" {
		f.Scope = string(*pr.Scope)
	}
	if pr.OwnerUserID != nil {
		f.Owner = *pr.OwnerUserID
	}
	var after *Position
	if pr.Cursor != nil && *pr.Cursor != "" {
		var pos Position
		if err := h.Cursors.Decode(*pr.Cursor, f.Key(), &pos); err != nil {
			return nil, err
		}
		after = &pos
	}
	size := pagination.Size(pr.PageSize)
	now := h.Svc.Clock.Now()
	ws, more, err := h.Svc.ListWorkloads(ctx, p.UserID, pc.ID, f, after, size, now)
	if err != nil {
		return nil, err
	}
	items, err := h.summaries(ctx, ws)
	if err != nil {
		return nil, err
	}
	var next *string
	if more {
		if next, err = h.Cursors.Next(true, f.Key(), PositionOf(ws[len(ws)-1], f.Sort)); err != nil {
			return nil, err
		}
	}
	return api.ListV3Workloads200JSONResponse{Body: api.V3WorkloadListResponse{
		Items: items, Pagination: api.Pagination{NextCursor: next, PageSize: size},
		Meta: api.V3ReadModelMeta{GeneratedAt: now.UTC(), Cache: CacheBypass},
	}}, nil
}

// GetV3Workload implements GET /api/v1/v3/workloads/{workload_id}.
func (h *Handlers) GetV3Workload(ctx context.Context, req api.GetV3WorkloadRequestObject) (api.GetV3WorkloadResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	pc, ok := projectctx.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
			With("field", "X-Project-ID").With("reason", "project_context_missing")
	}
	now := h.Svc.Clock.Now()
	w, err := h.Svc.GetWorkload(ctx, p.UserID, pc.ID, req.WorkloadID, now)
	if err != nil {
		return nil, err
	}
	items, err := h.summaries(ctx, []Workload{w})
	if err != nil {
		return nil, err
	}
	return api.GetV3Workload200JSONResponse{Body: api.V3WorkloadResponse{Workload: items[0],
		Meta: api.V3ReadModelMeta{GeneratedAt: now.UTC(), Cache: CacheBypass}}}, nil
}

// DismissV3Attention implements POST /api/v1/v3/attention/{attention_key}/dismiss.
func (h *Handlers) DismissV3Attention(ctx context.Context, req api.DismissV3AttentionRequestObject) (api.DismissV3AttentionResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	at, err := h.Svc.Dismiss(ctx, p, req.AttentionKey)
	if err != nil {
		return nil, err
	}
	return api.DismissV3Attention200JSONResponse{Body: api.V3AttentionDismissal{AttentionKey: req.AttentionKey, DismissedAt: at}}, nil
}

// summaries is the contract's view of ws with their cost projections.
func (h *Handlers) summaries(ctx context.Context, ws []Workload) ([]api.V3WorkloadSummary, error) {
	proj, err := h.Svc.Projections(ctx, ws, h.Svc.Clock.Now())
	if err != nil {
		return nil, err
	}
	out := make([]api.V3WorkloadSummary, 0, len(ws))
	for _, w := range ws {
		out = append(out, Summary(w, proj[w.AllocationID]))
	}
	return out, nil
}

func money(m *billing.Money) *api.Money {
	if m == nil {
		return nil
	}
	return &api.Money{AmountMinor: m.AmountMinor, Currency: m.Currency}
}

// Summary is the contract's view of a workload and its projection.
func Summary(w Workload, p Projection) api.V3WorkloadSummary {
	id, region, sku, node := w.AllocationID, w.RegionCode, w.Sku, w.NodeID
	out := api.V3WorkloadSummary{
		ID: w.ID(), AllocationID: &id, Name: w.Name, Kind: api.V3WorkloadKind("compute"), Status: api.V3WorkloadStatus(w.Status),
		ProjectID: w.ProjectID, ProjectName: w.ProjectName, RegionCode: &region, Sku: &sku, NodeID: &node, NodeName: w.NodeName,
		OwnerUserID: w.OwnerUserID, OwnerUsername: w.OwnerUsername, CreatedAt: w.CreatedAt.UTC(), ActiveAt: w.ActiveAt,
		EndedAt: w.EndedAt, HourlyRate: money(p.HourlyRate), AccruedCost: money(p.Accrued),
		IsActionable: w.Action.Actionable, NeedsAction: w.Action.Actionable, ActionRequired: w.Action.Required,
		ActionableUntil: w.Action.Until, AttentionDismissed: w.DismissedAt != nil,
	}
	if w.Action.Key != "" {
		k, r := w.Action.Key, w.Action.Reason
		out.AttentionKey, out.ActionReason = &k, &r
	}
	cp := api.V3WorkloadCostProjection{
		State: api.V3WorkloadCostProjectionState(p.State), HourlyRate: money(p.HourlyRate), Accrued: money(p.Accrued),
		PeriodStart: p.PeriodStart, PeriodEnd: p.PeriodEnd, ProjectedPeriodCost: money(p.Projected),
		RunwaySeconds: p.RunwaySeconds, RunwayEndsAt: p.RunwayEndsAt,
		RunwaySource: api.V3WorkloadCostProjectionRunwaySource(p.RunwaySource), ComputedAt: p.ComputedAt,
	}
	if p.Currency != "" {
		c := p.Currency
		cp.Currency = &c
	}
	out.CostProjection = cp
	return out
}

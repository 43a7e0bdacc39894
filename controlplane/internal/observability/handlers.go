package observability

import (
	"context"
	"sort"
	"time"

	openapi_types "github.com/oapi-codegen/runtime/types"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the observability read models, drills and runbook operations of
// the contract. Authorization (platform.ops.read, platform.ops.write,
// platform.ops.runbook.read) is decided by the server before these run.
type Handlers struct {
	Svc     *Service
	Drills  *Drills // nil: drills and the receiver are unavailable
	Cursors pagination.Codec
}

// NewHandlers returns the handlers of svc and drills.
func NewHandlers(svc *Service, drills *Drills, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Drills: drills, Cursors: cursors}
}

// Page sizes of the slo-evidence read model (seed 4.2.3); the alerts model uses the
// seed 8 defaults of the pagination package.
const (
	sloDefaultPageSize = 25
	sloMaxPageSize     = 100
)

// timeRanges are the fixed windows of time_range (seed 4.2.3).
var timeRanges = map[api.ObservabilityTimeRange]time.Duration{
	api.ObservabilityTimeRangeN1H: time.Hour, api.ObservabilityTimeRangeN6H: 6 * time.Hour,
	api.ObservabilityTimeRangeN24H: 24 * time.Hour, api.ObservabilityTimeRangeN7D: 7 * 24 * time.Hour,
	api.ObservabilityTimeRangeN30D: 30 * 24 * time.Hour,
}

func (h *Handlers) profile(p *string) error {
	if p != nil && *p != h.Svc.Config.Profile {
		return apierr.New(apierr.ValidationError, "environment_profile %q is not served here; this control plane runs profile %q", *p, h.Svc.Config.Profile).
			With("field", "environment_profile").With("reason", "profile_not_served")
	}
	return nil
}

// ListObservabilityAlerts is GET /api/v1/v3/platform/ops/observability/alerts.
func (h *Handlers) ListObservabilityAlerts(ctx context.Context, req api.ListObservabilityAlertsRequestObject) (api.ListObservabilityAlertsResponseObject, error) {
	p := req.Params
	if err := h.profile(p.EnvironmentProfile); err != nil {
		return nil, err
	}
	q := AlertsQuery{IncludeInactive: p.IncludeInactive != nil && *p.IncludeInactive}
	if p.Severity != nil {
		q.Severity = string(*p.Severity)
	}
	if p.State != nil {
		q.State = string(*p.State)
	}
	q.OwnerTeam, q.Service, q.Domain, q.Runbook = deref(p.OwnerTeam), deref(p.Service), deref(p.Domain), deref(p.RunbookID)
	var after string
	if err := h.Cursors.DecodeAfter(p.Cursor, "alerts:alert_name", &after); err != nil {
		return nil, err
	}
	size := pagination.Size(p.PageSize)
	out, more := h.Svc.Alerts(ctx, q, after, size)
	out.Pagination.PageSize = size
	if len(out.Items) > 0 {
		next, err := h.Cursors.Next(more, "alerts:alert_name", out.Items[len(out.Items)-1].AlertName)
		if err != nil {
			return nil, err
		}
		out.Pagination.NextCursor = next
	}
	return api.ListObservabilityAlerts200JSONResponse{Body: out}, nil
}

// GetObservabilitySloEvidence is GET /api/v1/v3/platform/ops/observability/slo-evidence.
func (h *Handlers) GetObservabilitySloEvidence(ctx context.Context, req api.GetObservabilitySloEvidenceRequestObject) (api.GetObservabilitySloEvidenceResponseObject, error) {
	p := req.Params
	if err := h.profile(p.EnvironmentProfile); err != nil {
		return nil, err
	}
	now := h.Svc.Clock.Now().UTC()
	q := SLOQuery{Service: deref(p.Service), SLOID: deref(p.SloID), ReleaseID: deref(p.ReleaseID),
		IncludeQueryOutcomes: p.IncludeQueryOutcomes == nil || *p.IncludeQueryOutcomes}
	tr := api.ObservabilityTimeRangeN30D
	if p.TimeRange != nil {
		tr = *p.TimeRange
	}
	q.RangeName = string(tr)
	if tr == api.ObservabilityTimeRangeCustom {
		switch {
		case p.From == nil:
			return nil, apierr.New(apierr.ValidationError, "time_range=custom needs from").With("field", "from").With("reason", "custom_range_incomplete")
		case p.To == nil:
			return nil, apierr.New(apierr.ValidationError, "time_range=custom needs to").With("field", "to").With("reason", "custom_range_incomplete")
		case !p.From.Before(*p.To):
			return nil, apierr.New(apierr.ValidationError, "from must be before to").With("field", "from").With("reason", "custom_range_inverted")
		}
		q.From, q.To = p.From.UTC(), p.To.UTC()
	} else {
		if p.From != nil || p.To != nil {
			field := "from"
			if p.From == nil {
				field = "to"
			}
			return nil, apierr.New(apierr.ValidationError, "from and to are only allowed with time_range=custom").
				With("field", field).With("reason", "custom_range_only")
		}
		q.From, q.To = now.Add(-timeRanges[tr]), now
	}
	size := sloDefaultPageSize
	if p.PageSize != nil {
		if *p.PageSize < 1 || *p.PageSize > sloMaxPageSize {
			return nil, apierr.New(apierr.ValidationError, "page_size must be between 1 and %d", sloMaxPageSize).With("field", "page_size")
		}
		size = *p.PageSize
	}
	var after string
	if err := h.Cursors.DecodeAfter(p.Cursor, "slo-evidence:slo_id", &after); err != nil {
		return nil, err
	}
	out, more := h.Svc.SLOEvidence(ctx, q, after, size)
	out.Pagination.PageSize = size
	if len(out.Items) > 0 {
		next, err := h.Cursors.Next(more, "slo-evidence:slo_id", out.Items[len(out.Items)-1].SloID)
		if err != nil {
			return nil, err
		}
		out.Pagination.NextCursor = next
	}
	return api.GetObservabilitySloEvidence200JSONResponse{Body: out}, nil
}

// GetObservabilityHealthSnapshot is GET /api/v1/v3/platform/ops/observability/health-snapshot.
func (h *Handlers) GetObservabilityHealthSnapshot(ctx context.Context, req api.GetObservabilityHealthSnapshotRequestObject) (api.GetObservabilityHealthSnapshotResponseObject, error) {
	p := req.Params
	if err := h.profile(p.EnvironmentProfile); err != nil {
		return nil, err
	}
	q := HealthQuery{IncludeEvidence: p.IncludeEvidence == nil || *p.IncludeEvidence,
		IncludePQ: p.IncludePrometheusQueries != nil && *p.IncludePrometheusQueries}
	if p.ComponentType != nil {
		q.ComponentType = string(*p.ComponentType)
	}
	if p.Status != nil {
		q.Status = string(*p.Status)
	}
	return api.GetObservabilityHealthSnapshot200JSONResponse{Body: h.Svc.HealthSnapshot(ctx, q)}, nil
}

// ListAdminRunbooks is GET /api/v1/admin/runbooks: the runbooks kept in deploy/runbooks,
// by id.
func (h *Handlers) ListAdminRunbooks(_ context.Context, req api.ListAdminRunbooksRequestObject) (api.ListAdminRunbooksResponseObject, error) {
	var after string
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, "runbooks:id", &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	rbs := append([]Runbook(nil), h.Svc.Manifest.Runbooks...)
	sort.Slice(rbs, func(i, j int) bool { return rbs[i].ID < rbs[j].ID })
	out := api.RunbookListResponse{Items: []api.RunbookSummary{}, Pagination: api.Pagination{PageSize: size}}
	more := false
	for _, rb := range rbs {
		if rb.ID <= after {
			continue
		}
		if len(out.Items) == size {
			more = true
			break
		}
		out.Items = append(out.Items, api.RunbookSummary{ID: rb.ID, Title: rb.Title, Severity: rb.Severity, OwnerTeam: rb.OwnerTeam,
			Href: runbookHref(rb.ID), Service: rb.Service, Domain: rb.Domain, Summary: rb.Summary, LastReviewed: reviewed(rb)})
	}
	if len(out.Items) > 0 {
		next, err := h.Cursors.Next(more, "runbooks:id", out.Items[len(out.Items)-1].ID)
		if err != nil {
			return nil, err
		}
		out.Pagination.NextCursor = next
	}
	return api.ListAdminRunbooks200JSONResponse{Body: out}, nil
}

// GetAdminRunbook is GET /api/v1/admin/runbooks/{runbook_id}.
func (h *Handlers) GetAdminRunbook(_ context.Context, req api.GetAdminRunbookRequestObject) (api.GetAdminRunbookResponseObject, error) {
	rb, ok := h.Svc.Manifest.Runbook(req.RunbookID)
	if !ok {
		return nil, apierr.New(apierr.InvalidRequest, "no runbook %q", req.RunbookID).
			With("field", "runbook_id").With("reason", "runbook_not_found").WithStatus(404)
	}
	return api.GetAdminRunbook200JSONResponse{Body: api.Runbook{ID: rb.ID, Title: rb.Title, Severity: rb.Severity,
		OwnerTeam: rb.OwnerTeam, Href: runbookHref(rb.ID), BodyMarkdown: rb.Body, Service: rb.Service, Domain: rb.Domain,
		Summary: rb.Summary, LastReviewed: reviewed(rb), Alerts: nonNil(rb.Alerts), Signals: nonNil(rb.Signals)}}, nil
}

// reviewed is the runbook's last_reviewed date (checked by LoadManifest).
func reviewed(rb Runbook) openapi_types.Date {
	t, _ := time.Parse(time.DateOnly, rb.LastReviewed)
	return openapi_types.Date{Time: t}
}

func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

func runbookHref(id string) string { return "/api/v1/admin/runbooks/" + id }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

package readmodels

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Shell modes (contract V3ShellMode), in the order available_modes lists them; the
// first available one is the default.
const (
	ModeUser          = "user"
	ModeProjectAdmin  = "project_admin"
	ModeTenantAdmin   = "tenant_admin"
	ModePlatformAdmin = "platform_admin"
	ModeOps           = "ops"
)

// modeInfo is each mode's label and landing route (absolute frontend routes); a
// project admin lands on the project's settings.
var modeInfo = map[string]struct{ label, landing string }{
	ModeUser:          {"Workspace", "/workloads"},
	ModeProjectAdmin:  {"Project administration", "/projects/%s/settings"},
	ModeTenantAdmin:   {"Organization administration", "/organization"},
	ModePlatformAdmin: {"Platform administration", "/admin"},
	ModeOps:           {"Operations", "/ops"},
}

// Modes are the shell modes the caller's roles allow (project: the shell's project, nil
// without one).
func Modes(p *principal.Principal, project *projectctx.Project) []string {
	var out []string
	if p.TenantID != uuid.Nil || p.IsMachine() {
		out = append(out, ModeUser)
	}
	if project != nil && project.AtLeast(projectctx.RoleAdmin) {
		out = append(out, ModeProjectAdmin)
	}
	if p.TenantRole == principal.TenantRoleAdmin && p.TenantID != uuid.Nil {
		out = append(out, ModeTenantAdmin)
	}
	if p.Can(principal.CapAdmin) {
		out = append(out, ModePlatformAdmin)
	}
	if p.Can(principal.CapOpsRead) {
		out = append(out, ModeOps)
	}
	if len(out) == 0 {
		// A platform user outside any tenant with no capability still has a shell.
		out = append(out, ModeUser)
	}
	return out
}

// Attention is the shell's counters for one user in one project.
type Attention struct {
	ActiveWorkloads     int `json:"active_workloads"`
	NeedsAction         int `json:"needs_action"`
	ActiveTasks         int `json:"active_tasks"`
	UnreadNotifications int `json:"unread_notifications"`
}

// activeStatuses are the workloads that count as active: not ended and in no recovery
// condition.
const activeStatusesSQL = `('requested', 'provisioning', 'active', 'idle', 'stopped', 'restarting', 'releasing')`

// Attention counts, exactly and in one statement, the caller's attention in project
// (uuid.Nil: none; then only tenant-wide notifications count) at now: active workloads,
// workloads needing action (in their window and not dismissed by the caller), unfinished
// node tasks of the project's allocations, and notifications after the caller's read
// marker (allocation status changes of the project and budget events of the tenant and
// the project; docs/operations.md, "Notifications read marker").
func (s *Service) Attention(ctx context.Context, user, tenant, project uuid.UUID, now time.Time) (Attention, error) {
	w := s.Windows
	var a Attention
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `
WITH marker AS (
    SELECT coalesce((SELECT read_through FROM notification_read_markers WHERE user_id = $2),
                    (SELECT created_at FROM users WHERE id = $2)) AS at
)
SELECT
  (SELECT count(*) FROM allocations a WHERE a.project_id = $1 AND a.status IN `+activeStatusesSQL+`),
  (SELECT count(*) FROM allocations a
     LEFT JOIN v3_attention_dismissals d ON d.user_id = $2 AND d.allocation_id = a.id
          AND d.condition = a.status AND d.condition_since = a.updated_at
   WHERE a.project_id = $1 AND `+inWindowSQL(3, 4, 5)+` AND d.dismissed_at IS NULL),
  (SELECT count(*) FROM allocation_tasks t JOIN allocations a ON a.id = t.allocation_id
   WHERE a.project_id = $1 AND t.finished_at IS NULL),
  (SELECT count(*) FROM allocation_events e JOIN allocations a ON a.id = e.allocation_id
   WHERE a.project_id = $1 AND e.created_at > (SELECT at FROM marker))
  + (SELECT count(*) FROM budget_events be JOIN budgets b ON b.id = be.budget_id
     WHERE be.tenant_id = $6 AND (b.project_id IS NULL OR b.project_id = $1)
       AND be.first_seen_at > (SELECT at FROM marker))`,
		project, user, now.Add(-w.ReleaseFailed), now.Add(-w.RestartFailed), now.Add(-w.Failed), tenant,
	).Scan(&a.ActiveWorkloads, &a.NeedsAction, &a.ActiveTasks, &a.UnreadNotifications)
	if err != nil {
		return Attention{}, fmt.Errorf("attention: %w", err)
	}
	return a, nil
}

// shellEntry is what the cache keeps: the context without its mode selection and meta,
// and when it was computed.
type shellEntry struct {
	ComputedAt time.Time          `json:"computed_at"`
	Context    api.V3ShellContext `json:"context"`
}

// Cache states (contract V3ReadModelMeta.cache).
const (
	CacheHit    = "hit"
	CacheMiss   = "miss"
	CacheBypass = "bypass"
	CacheStale  = "stale"
)

// ShellContext answers the caller's shell context in project (nil: none) with mode
// active ("" = the default), from the cache unless bypass. It computes afresh when the
// cached entry is older than CacheTTL; if that fails and an entry is kept, the entry is
// served as stale. A cache that fails is treated as empty (the answer is computed).
func (s *Service) ShellContext(ctx context.Context, p *principal.Principal, project *projectctx.Project, mode string, bypass bool) (api.V3ShellContext, error) {
	now := s.Clock.Now()
	field := "-"
	if project != nil {
		field = project.ID.String()
	}
	var kept *shellEntry
	if !bypass && s.Cache != nil {
		b, ok, err := s.Cache.Get(ctx, p.UserID, field)
		if err != nil {
			s.log().Warn("shell context cache read failed; computing", "error", err)
		} else if ok {
			var e shellEntry
			if json.Unmarshal(b, &e) == nil {
				kept = &e
			}
		}
	}
	state := CacheMiss
	var out api.V3ShellContext
	switch {
	case kept != nil && now.Sub(kept.ComputedAt) < s.CacheTTL:
		out, state = kept.Context, CacheHit
	default:
		c, err := s.computeShell(ctx, p, project, now)
		if err != nil {
			if kept == nil {
				return api.V3ShellContext{}, err
			}
			s.log().Warn("shell context refresh failed; serving the cached answer as stale", "error", err)
			out, state = kept.Context, CacheStale
			break
		}
		out = c
		if bypass {
			state = CacheBypass
		}
		if s.Cache != nil {
			if b, err := json.Marshal(shellEntry{ComputedAt: now, Context: c}); err == nil {
				if err := s.Cache.Put(ctx, p.UserID, field, b, s.CacheKeep); err != nil {
					s.log().Warn("shell context cache write failed", "error", err)
				}
			}
		}
	}
	if err := selectMode(&out, mode); err != nil {
		return api.V3ShellContext{}, err
	}
	out.Meta = api.V3ReadModelMeta{GeneratedAt: now.UTC(), Cache: api.V3ReadModelMetaCache(state)}
	return out, nil
}

func (s *Service) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// computeShell builds the context from the sources, without mode selection or meta.
func (s *Service) computeShell(ctx context.Context, p *principal.Principal, project *projectctx.Project, now time.Time) (api.V3ShellContext, error) {
	out := api.V3ShellContext{Regions: []api.V3Region{}}
	me, err := s.Tenancy.Me(ctx, p)
	if err != nil {
		return out, err
	}
	out.User = api.V3ShellUser{ID: me.User.ID, Username: me.User.Username, DisplayName: me.User.DisplayName}
	if me.OrgID != uuid.Nil {
		out.Tenant = &api.V3ShellTenant{ID: me.OrgID, Name: me.OrgName}
	}
	if project == nil && me.ProjectID != uuid.Nil {
		// Without X-Project-ID the shell opens on the tenant's default project, when the
		// caller may see it.
		if pc, err := s.Tenancy.Access(ctx, p, me.ProjectID); err == nil {
			project = &pc
		}
	}
	projectID := uuid.Nil
	if project != nil {
		projectID = project.ID
		out.Project = &api.V3ShellProject{ID: project.ID, Name: project.Name, Slug: project.Slug}
	}
	modes := Modes(p, project)
	for _, m := range modes {
		info := modeInfo[m]
		landing := info.landing
		if m == ModeProjectAdmin {
			landing = fmt.Sprintf(landing, projectID)
		}
		out.AvailableModes = append(out.AvailableModes, api.V3ShellMode(m))
		out.ModeOptions = append(out.ModeOptions, api.V3ShellModeOption{ID: api.V3ShellMode(m), Label: info.label, DefaultLanding: landing})
	}
	regions, err := s.Regions.Regions(ctx)
	if err != nil {
		return out, err
	}
	out.Regions = regions
	if me.OrgID != uuid.Nil {
		amount, currency, err := s.Balance.Balance(ctx, me.OrgID)
		if err != nil {
			return out, fmt.Errorf("balance: %w", err)
		}
		out.Balance = &api.Money{AmountMinor: amount, Currency: currency}
	}
	att, err := s.Attention(ctx, p.UserID, me.OrgID, projectID, now)
	if err != nil {
		return out, err
	}
	out.Attention = api.V3ShellAttention{ActiveWorkloads: att.ActiveWorkloads, NeedsAction: att.NeedsAction,
		ActiveTasks: att.ActiveTasks, UnreadNotifications: att.UnreadNotifications}
	return out, nil
}

// selectMode marks mode ("" = the first available) active, or refuses a mode the caller
// does not have.
func selectMode(c *api.V3ShellContext, mode string) error {
	if mode == "" && len(c.AvailableModes) > 0 {
		mode = string(c.AvailableModes[0])
	}
	found := false
	for i := range c.ModeOptions {
		c.ModeOptions[i].IsActive = string(c.ModeOptions[i].ID) == mode
		found = found || c.ModeOptions[i].IsActive
	}
	if !found {
		return errModeNotAvailable(mode)
	}
	c.Mode = api.V3ShellMode(mode)
	return nil
}

package readmodels

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Workload ids: an allocation is "alloc:<uuid>" (app instances will be "app:<uuid>").
const allocPrefix = "alloc:"

// AllocationWorkloadID is the workload id of an allocation.
func AllocationWorkloadID(id uuid.UUID) string { return allocPrefix + id.String() }

// parseWorkloadID is the allocation of a workload id, false for any other id.
func parseWorkloadID(s string) (uuid.UUID, bool) {
	rest, ok := strings.CutPrefix(s, allocPrefix)
	if !ok {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(rest)
	return id, err == nil && id.String() == rest
}

// Workload is one row of the workloads read model, before costs.
type Workload struct {
	AllocationID  uuid.UUID
	TenantID      uuid.UUID
	Name          string
	Status        string
	ProjectID     uuid.UUID
	ProjectName   string
	RegionCode    string
	Sku           string
	GPUCount      int32
	UsageUnit     string
	NodeID        uuid.UUID
	NodeName      *string
	OwnerUserID   uuid.UUID
	OwnerUsername string
	CreatedAt     time.Time
	UpdatedAt     time.Time // when it entered Status (allocations change updated_at only with status)
	ActiveAt      *time.Time
	EndedAt       *time.Time
	HourlyRate    *int64
	Currency      *string
	DismissedAt   *time.Time // the caller's dismissal of the current condition
	Action        Action
}

// ID is the workload id.
func (w Workload) ID() string { return AllocationWorkloadID(w.AllocationID) }

// Sorts of the workloads list (contract V3WorkloadSortOrder).
const (
	SortCreatedDesc = "created_at_desc"
	SortCreatedAsc  = "created_at_asc"
	SortNameAsc     = "name_asc"
	SortNameDesc    = "name_desc"
)

// Filter is the workloads list's filters.
type Filter struct {
	Status      string // "" = any
	Kind        string // "" = any; allocations are compute
	Scope       string // live, history, all ("" = all)
	NeedsAction *bool
	Owner       uuid.UUID // uuid.Nil = any
	Sort        string
}

// Key is the part of a cursor that binds it to the filter and sort it was issued for.
func (f Filter) Key() string {
	na := "-"
	if f.NeedsAction != nil {
		na = fmt.Sprint(*f.NeedsAction)
	}
	return strings.Join([]string{"v3.workloads", f.Sort, f.Status, f.Kind, f.Scope, na, f.Owner.String()}, "|")
}

// Position is where a page ended: the sort column of its last row and its id.
type Position struct {
	At   *time.Time `json:"t,omitempty"`
	Name *string    `json:"n,omitempty"`
	ID   uuid.UUID  `json:"i"`
}

// workloadColumns is the select list every workload read shares, over a row source
// named a (the allocations, or a page of them); $1 is the caller.
const workloadColumns = `a.id, a.tenant_id, a.name, a.status, a.project_id, p.name, a.region_code, a.sku, a.gpu_count, a.usage_unit,
       a.node_id, n.name, a.owner_user_id, u.username, a.created_at, a.updated_at, a.active_at, a.ended_at,
       a.hourly_rate_minor, a.currency, d.dismissed_at`

// workloadJoins names the project, owner, node and the caller's dismissal of the
// current condition.
const workloadJoins = `
JOIN projects p ON p.id = a.project_id
JOIN users u ON u.id = a.owner_user_id
LEFT JOIN nodes n ON n.id = a.node_id
LEFT JOIN v3_attention_dismissals d ON d.user_id = $1 AND d.allocation_id = a.id
     AND d.condition = a.status AND d.condition_since = a.updated_at`

// dismissedSQL is "the caller ($1) dismissed a's current condition".
const dismissedSQL = `EXISTS (SELECT 1 FROM v3_attention_dismissals d WHERE d.user_id = $1 AND d.allocation_id = a.id
     AND d.condition = a.status AND d.condition_since = a.updated_at)`

// Read models read other features' tables (allocations, projects, users, nodes) read-only
// and in one statement: a page of 200 summaries is one round trip, not one call per
// feature per row (docs/operations.md, "Why one query"). The statements are composed
// here because filters and sorts combine freely.

func scanWorkload(row pgx.Row) (Workload, error) {
	var w Workload
	err := row.Scan(&w.AllocationID, &w.TenantID, &w.Name, &w.Status, &w.ProjectID, &w.ProjectName, &w.RegionCode, &w.Sku,
		&w.GPUCount, &w.UsageUnit, &w.NodeID, &w.NodeName, &w.OwnerUserID, &w.OwnerUsername, &w.CreatedAt, &w.UpdatedAt,
		&w.ActiveAt, &w.EndedAt, &w.HourlyRate, &w.Currency, &w.DismissedAt)
	return w, err
}

// inWindowSQL is the SQL of "a recovery condition still in its window" with the window
// starts as parameters $a (release_failed), $b (restart_failed), $c (failed).
func inWindowSQL(a, b, c int) string {
	return fmt.Sprintf(`((a.status = 'release_failed' AND a.updated_at > $%d) OR (a.status = 'restart_failed' AND a.updated_at > $%d) OR (a.status = 'failed' AND a.updated_at > $%d))`, a, b, c)
}

// liveSQL is "listed under scope=live" for the window parameters of inWindowSQL.
func liveSQL(a, b, c int) string {
	return `(a.status NOT IN ('released', 'completed', 'failed', 'release_failed', 'restart_failed') OR ` + inWindowSQL(a, b, c) + `)`
}

// ListWorkloads is one page (limit rows, plus one to tell whether more follow) of the
// project's workloads for caller under f, after pos (nil: the first page), at now.
func (s *Service) ListWorkloads(ctx context.Context, caller, projectID uuid.UUID, f Filter, after *Position, limit int, now time.Time) ([]Workload, bool, error) {
	if f.Kind != "" && f.Kind != "compute" {
		return nil, false, nil // allocations are compute workloads; app instances do not exist yet
	}
	w := s.Windows
	args := []any{caller, projectID}
	var where []string
	where = append(where, "a.project_id = $2")
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	// The window starts are parameters only when a filter uses them (an unused
	// parameter has no type PostgreSQL can infer).
	win := 0
	windows := func() (int, int, int) {
		if win == 0 {
			args = append(args, now.Add(-w.ReleaseFailed), now.Add(-w.RestartFailed), now.Add(-w.Failed))
			win = len(args) - 2
		}
		return win, win + 1, win + 2
	}
	if f.Status != "" {
		where = append(where, "a.status = "+arg(f.Status))
	}
	switch f.Scope {
	case "live":
		where = append(where, liveSQL(windows()))
	case "history":
		where = append(where, "NOT "+liveSQL(windows()))
	}
	if f.NeedsAction != nil {
		actionable := "(" + inWindowSQL(windows()) + " AND NOT " + dismissedSQL + ")"
		if *f.NeedsAction {
			where = append(where, actionable)
		} else {
			where = append(where, "NOT "+actionable)
		}
	}
	if f.Owner != uuid.Nil {
		where = append(where, "a.owner_user_id = "+arg(f.Owner))
	}
	var order string
	switch f.Sort {
	case SortCreatedAsc:
		order = "a.created_at ASC, a.id ASC"
		if after != nil && after.At != nil {
			where = append(where, fmt.Sprintf("(a.created_at, a.id) > (%s, %s)", arg(*after.At), arg(after.ID)))
		}
	case SortNameAsc:
		order = "a.name ASC, a.id ASC"
		if after != nil && after.Name != nil {
			where = append(where, fmt.Sprintf("(a.name, a.id) > (%s, %s)", arg(*after.Name), arg(after.ID)))
		}
	case SortNameDesc:
		order = "a.name DESC, a.id DESC"
		if after != nil && after.Name != nil {
			where = append(where, fmt.Sprintf("(a.name, a.id) < (%s, %s)", arg(*after.Name), arg(after.ID)))
		}
	default:
		order = "a.created_at DESC, a.id DESC"
		if after != nil && after.At != nil {
			where = append(where, fmt.Sprintf("(a.created_at, a.id) < (%s, %s)", arg(*after.At), arg(after.ID)))
		}
	}
	// The page is chosen from allocations alone (an index scan in the sort's order
	// whatever the statistics say), then joined: 10,000 workloads cost a page, not a
	// hash of the project.
	q := "SELECT " + workloadColumns + "\nFROM (SELECT * FROM allocations a WHERE " + strings.Join(where, " AND ") +
		"\n  ORDER BY " + order + " LIMIT " + arg(limit+1) + ") a" + workloadJoins + "\nORDER BY " + order
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, q, args...)
	if err != nil {
		return nil, false, fmt.Errorf("workloads: %w", err)
	}
	defer rows.Close()
	var out []Workload
	for rows.Next() {
		wl, err := scanWorkload(rows)
		if err != nil {
			return nil, false, fmt.Errorf("workloads: %w", err)
		}
		wl.Action = s.Windows.Derive(wl.ID(), wl.Status, wl.UpdatedAt, now, wl.DismissedAt != nil)
		out = append(out, wl)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("workloads: %w", err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// PositionOf is the cursor position of w under sort.
func PositionOf(w Workload, sort string) Position {
	switch sort {
	case SortNameAsc, SortNameDesc:
		n := w.Name
		return Position{Name: &n, ID: w.AllocationID}
	}
	t := w.CreatedAt
	return Position{At: &t, ID: w.AllocationID}
}

// errWorkloadNotFound is the answer for a workload that does not exist or is another
// project's: allocation_not_found (workloads are allocations until apps exist).
func errWorkloadNotFound() error {
	return apierr.New(apierr.AllocationNotFound, "workload not found")
}

// GetWorkload is one workload of the project for caller at now.
func (s *Service) GetWorkload(ctx context.Context, caller, projectID uuid.UUID, workloadID string, now time.Time) (Workload, error) {
	id, ok := parseWorkloadID(workloadID)
	if !ok {
		return Workload{}, errWorkloadNotFound()
	}
	row := db.Querier(ctx, s.Pool).QueryRow(ctx, "SELECT "+workloadColumns+"\nFROM allocations a"+workloadJoins+"\nWHERE a.id = $2 AND a.project_id = $3", caller, id, projectID)
	w, err := scanWorkload(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Workload{}, errWorkloadNotFound()
	}
	if err != nil {
		return Workload{}, fmt.Errorf("workload: %w", err)
	}
	w.Action = s.Windows.Derive(w.ID(), w.Status, w.UpdatedAt, now, w.DismissedAt != nil)
	return w, nil
}

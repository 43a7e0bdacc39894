package sharedruntimes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// serving is the runtime an app instance serves as a worker that takes calls (not
// draining, stopped or failed); ok false when the instance is no such worker.
func (s *Service) serving(ctx context.Context, instanceID uuid.UUID) (Runtime, bool, error) {
	r, err := scanRuntime(db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+runtimeColumns+` FROM shared_runtimes r
		JOIN shared_runtime_workers w ON w.shared_runtime_id = r.id
		WHERE w.app_instance_id = $1 AND w.state NOT IN ('draining', 'stopped', 'failed')`, instanceID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Runtime{}, false, nil
	}
	if err != nil {
		return Runtime{}, false, fmt.Errorf("shared runtime of instance: %w", err)
	}
	return r, true, nil
}

// ProxyGrant implements proxy.Grants: a caller who is not a member of the worker's
// (owner) project gets through when a project they may act in is attached to the
// runtime; that project, the earliest attached, pays for the call.
func (s *Service) ProxyGrant(ctx context.Context, p *principal.Principal, t proxy.Target) (uuid.UUID, bool, error) {
	r, ok, err := s.serving(ctx, t.InstanceID)
	if err != nil || !ok {
		return uuid.Nil, false, err
	}
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT project_id FROM shared_runtime_attachments
		WHERE shared_runtime_id = $1 ORDER BY created_at, id LIMIT 64`, r.ID)
	if err != nil {
		return uuid.Nil, false, fmt.Errorf("attachments: %w", err)
	}
	var projects []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return uuid.Nil, false, err
		}
		projects = append(projects, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return uuid.Nil, false, err
	}
	for _, id := range projects {
		proj, err := s.Projects.Access(ctx, p, id)
		if err == nil && proj.Role != "" {
			return id, true, nil
		}
		if ae, isAPI := apierr.As(err); err != nil && (!isAPI || ae.HTTPStatus() >= 500) {
			return uuid.Nil, false, err // not a refusal: the database failed
		}
	}
	return uuid.Nil, false, nil
}

// ProxiedCall implements proxy.Meter: a call by an attached project to a worker is one
// unit, recorded once per call id however often it is reported; the owner project's own
// calls are not metered (it pays for the allocations). Rating happens in RateCalls.
func (s *Service) ProxiedCall(ctx context.Context, c proxy.Call) error {
	if c.Target.ProjectID != uuid.Nil && c.ProjectID == c.Target.ProjectID {
		// A member of the instance's own project (a worker's: the owner): nothing to
		// meter, and no query on the proxy's path for every ordinary app instance.
		return nil
	}
	r, ok, err := s.serving(ctx, c.Target.InstanceID)
	if err != nil || !ok || c.ProjectID == r.OwnerProjectID {
		return err
	}
	tag, err := db.Querier(ctx, s.Pool).Exec(ctx, `INSERT INTO shared_runtime_usage (call_id, shared_runtime_id, attachment_id, tenant_id, project_id, user_id, occurred_at)
		SELECT $1, a.shared_runtime_id, a.id, a.tenant_id, a.project_id, $4, $5 FROM shared_runtime_attachments a
		WHERE a.shared_runtime_id = $2 AND a.project_id = $3
		ON CONFLICT (call_id) DO NOTHING`, c.CallID, r.ID, c.ProjectID, c.UserID, c.At.UTC())
	if err != nil {
		return fmt.Errorf("meter call: %w", err)
	}
	if tag.RowsAffected() == 0 {
		var exists bool
		if err := db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM shared_runtime_usage WHERE call_id = $1)`, c.CallID).Scan(&exists); err != nil {
			return err
		}
		if !exists { // not attached (any more): the call is refused rather than served unpaid
			return apierr.Forbidden("the project is not attached to this shared runtime")
		}
	}
	return nil
}

// RateStats says what a RateCalls pass did.
type RateStats struct {
	Calls   int // units rated
	Records int // usage records written
	Failed  int // groups left for the next pass (no price, say)
}

// RateCalls rates unrated calls: each group of calls of one runtime, project and user
// becomes one app_runtime usage record of quantity n over one second (n units), rated
// at once through the billing engine; the calls are marked with the record in the same
// transaction, so a call is rated once even with concurrent passes (rows are claimed
// with SKIP LOCKED).
func (s *Service) RateCalls(ctx context.Context, batch int) (RateStats, error) {
	if batch <= 0 {
		batch = 1000
	}
	var st RateStats
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT u.call_id, u.shared_runtime_id, u.tenant_id, u.project_id, u.user_id, u.occurred_at, r.currency
			FROM shared_runtime_usage u JOIN shared_runtimes r ON r.id = u.shared_runtime_id
			WHERE u.usage_record_id IS NULL ORDER BY u.occurred_at LIMIT $1 FOR UPDATE OF u SKIP LOCKED`, batch)
		if err != nil {
			return fmt.Errorf("unrated calls: %w", err)
		}
		type key struct{ runtime, tenant, project, user uuid.UUID }
		type group struct {
			calls    []uuid.UUID
			first    time.Time
			currency string
		}
		groups := map[key]*group{}
		var order []key
		for rows.Next() {
			var id uuid.UUID
			var k key
			var at time.Time
			var cur string
			if err := rows.Scan(&id, &k.runtime, &k.tenant, &k.project, &k.user, &at, &cur); err != nil {
				rows.Close()
				return err
			}
			g := groups[k]
			if g == nil {
				g = &group{first: at, currency: cur}
				groups[k] = g
				order = append(order, k)
			}
			g.calls = append(g.calls, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, k := range order {
			g := groups[k]
			err := db.InTx(db.WithTx(ctx, tx), s.Pool, func(sp pgx.Tx) error {
				source := s.IDs.New()
				start := g.first.UTC().Truncate(time.Millisecond)
				rec, err := s.Usage.StartUsage(ctx, sp, billing.UsageStart{Source: billing.SourceAppRuntime, SourceID: source,
					TenantID: k.tenant, ProjectID: k.project, UserID: k.user, Unit: BillingUnit(k.runtime),
					Quantity: int64(len(g.calls)), Currency: g.currency, StartedAt: start})
				if err != nil {
					return err
				}
				if _, err := s.Usage.StopUsage(ctx, sp, billing.SourceAppRuntime, source, start.Add(time.Second)); err != nil {
					return err
				}
				_, err = sp.Exec(ctx, `UPDATE shared_runtime_usage SET usage_record_id = $2 WHERE call_id = ANY($1)`, g.calls, rec.ID)
				return err
			})
			if err != nil {
				st.Failed++
				s.Log.WarnContext(ctx, "shared runtime calls not rated", "shared_runtime_id", k.runtime, "project_id", k.project, "calls", len(g.calls), "err", err)
				continue
			}
			st.Calls += len(g.calls)
			st.Records++
		}
		return nil
	})
	return st, err
}

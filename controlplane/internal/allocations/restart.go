package allocations

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Restart asks the node's agent to restart the allocation's workload: active, idle,
// stopped and restart_failed move to restarting and a restart task goes out (state.go);
// the agent's report moves it to active or restart_failed (reports.go). The lifecycle's
// refusals are the answer for every other status (allocation_not_active,
// allocation_already_releasing).
//
// A stopped allocation resumes billing when it is active again, so the money checks of
// a launch run first (budget decision, balance runway), priced at the allocation's
// hourly rate and billed in its currency: a budget suspension or an exhausted runway
// that stopped it also keeps it from restarting until the budget or wallet allows it.
// The other statuses are billed already (or, restart_failed, still open), so they need
// no check.
func (s *Service) Restart(ctx context.Context, p *principal.Principal, proj projectctx.Project, id uuid.UUID) (Allocation, error) {
	a, err := s.Get(ctx, proj.ID, id)
	if err != nil {
		return Allocation{}, err
	}
	if !proj.AtLeast(projectctx.RoleMember) {
		return Allocation{}, apierr.New(apierr.InsufficientPermissions, "viewers cannot restart allocations in this project").
			With("required_role", projectctx.RoleMember)
	}
	// Refuse what the lifecycle refuses before looking at money: a restart on a
	// releasing allocation is allocation_already_releasing, not a budget answer.
	if _, err := lifecycle.Apply(lifecycle.Status(a.Status), lifecycle.Restart); err != nil {
		return Allocation{}, err
	}
	if lifecycle.Status(a.Status) == lifecycle.Stopped {
		currency := ""
		if a.Currency != nil {
			currency = *a.Currency
		}
		hourlyIn := func(d billing.Decision) (int64, bool, error) {
			if a.HourlyRateMinor.Valid && a.Currency != nil && *a.Currency == d.Currency {
				return a.HourlyRateMinor.Int64, true, nil
			}
			return 0, false, nil
		}
		if _, _, _, err := s.affordable(ctx, a.TenantID, a.ProjectID, a.UsageUnit, int64(a.GpuCount), currency, hourlyIn, 1); err != nil {
			return Allocation{}, err
		}
	}
	// The move itself re-reads the allocation under its lock: a concurrent change wins
	// or loses by the lifecycle's rules, never half-applied.
	return s.apply(ctx, id, &proj.ID, lifecycle.Restart, Actor{Type: ActorUser, ID: p.UserID.String()}, "restarted by user")
}

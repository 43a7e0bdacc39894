package catalog

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// PlanBook is the part of billing that BillingPrices reads (implemented by
// *billing.Service).
type PlanBook interface {
	Account(ctx context.Context, tenantID uuid.UUID) (billing.AccountView, error)
	GetPlan(ctx context.Context, id uuid.UUID) (billing.Plan, error)
	ListPlans(ctx context.Context) ([]billing.Plan, error)
}

// BillingPrices implements Prices over billing's pricing plans: the tenant's own plan
// when its billing account names one, else the default plan; the version in force now.
type BillingPrices struct {
	Billing PlanBook
	Clock   clock.Clock
}

var _ Prices = BillingPrices{}

// UnitPrices implements Prices.
func (b BillingPrices) UnitPrices(ctx context.Context, tenantID uuid.UUID) (map[string][]Price, error) {
	plan, ok, err := b.plan(ctx, tenantID)
	if err != nil || !ok {
		return map[string][]Price{}, err
	}
	now := b.Clock.Now()
	var inForce *billing.PlanVersion
	for i := range plan.Versions { // oldest first
		if !plan.Versions[i].EffectiveFrom.After(now) {
			inForce = &plan.Versions[i]
		}
	}
	out := map[string][]Price{}
	if inForce == nil {
		return out, nil
	}
	for _, p := range inForce.Prices {
		exp, known := billing.Exponent(p.Currency)
		if !known {
			continue
		}
		out[p.Unit] = append(out[p.Unit], Price{
			Currency: p.Currency, UnitPrice: p.UnitPrice, Exponent: exp, PlanID: plan.ID, PlanVersion: inForce.Version,
		})
	}
	for _, ps := range out {
		slices.SortFunc(ps, func(a, b Price) int { return strings.Compare(a.Currency, b.Currency) })
	}
	return out, nil
}

func (b BillingPrices) plan(ctx context.Context, tenantID uuid.UUID) (billing.Plan, bool, error) {
	if tenantID != uuid.Nil {
		acct, err := b.Billing.Account(ctx, tenantID)
		if err != nil {
			return billing.Plan{}, false, fmt.Errorf("billing account: %w", err)
		}
		if acct.PricingPlanID != nil {
			p, err := b.Billing.GetPlan(ctx, *acct.PricingPlanID)
			return p, err == nil, err
		}
	}
	plans, err := b.Billing.ListPlans(ctx)
	if err != nil {
		return billing.Plan{}, false, err
	}
	for _, p := range plans {
		if p.IsDefault {
			return p, true, nil
		}
	}
	return billing.Plan{}, false, nil
}

// FleetView is the part of node administration that NodesFleet reads (implemented by
// *nodes.Service).
type FleetView interface {
	Fleet(ctx context.Context, after uuid.UUID, limit int) (nodes.FleetView, error)
}

// NodesFleet implements Fleet over node administration's fleet view, with the same
// buckets: a GPU is free when no live allocation holds it, its latest sample does not
// say unhealthy, and its node is online and schedulable.
type NodesFleet struct {
	Nodes FleetView
}

var _ Fleet = NodesFleet{}

// FreeGPUs implements Fleet.
func (f NodesFleet) FreeGPUs(ctx context.Context) ([]NodeFree, error) {
	view, err := f.Nodes.Fleet(ctx, uuid.Nil, math.MaxInt32)
	if err != nil {
		return nil, err
	}
	var out []NodeFree
	for _, n := range view.Nodes {
		if n.Status != nodes.StatusOnline || nodes.ScheduleState(n.ScheduleState) != nodes.Schedulable {
			continue
		}
		region := ""
		if n.Region != nil {
			region = *n.Region
		}
		free := map[string]int{}
		var models []string
		for _, g := range n.GPUs {
			if g.Allocated || (g.Healthy.Valid && !g.Healthy.Bool) {
				continue
			}
			if _, seen := free[g.Model]; !seen {
				models = append(models, g.Model)
			}
			free[g.Model]++
		}
		for _, m := range models {
			out = append(out, NodeFree{NodeID: n.ID, Region: region, GPUModel: m, Free: free[m]})
		}
	}
	return out, nil
}

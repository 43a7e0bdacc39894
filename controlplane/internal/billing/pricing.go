package billing

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Pricing plans are versioned price books: a version holds the exact decimal price of
// one unit (one unit-second, e.g. "gpu.h100.sxm5" for one H100 GPU-second) per
// currency, takes effect at its effective_from, and is immutable. Rating splits a run at
// the boundary where a new version takes effect.

var unitPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._:-]{0,63}$`)

// PriceInput is one price of a version.
type PriceInput struct {
	Unit      string
	Currency  string
	UnitPrice string // exact decimal, e.g. "0.000694"
}

// PlanVersion is a version of a plan with its prices.
type PlanVersion struct {
	Version       int32
	EffectiveFrom time.Time
	Prices        []PriceInput
	CreatedAt     time.Time
}

// Plan is a pricing plan with its versions (oldest first).
type Plan struct {
	ID        uuid.UUID
	Name      string
	IsDefault bool
	Versions  []PlanVersion
	CreatedAt time.Time
}

func validatePrices(prices []PriceInput) error {
	if len(prices) < 1 || len(prices) > 200 {
		return apierr.Validation("prices", "a version has 1 to 200 prices").With("reason", "prices_count")
	}
	seen := map[string]bool{}
	for i, p := range prices {
		field := fmt.Sprintf("prices[%d]", i)
		if !unitPattern.MatchString(p.Unit) {
			return apierr.Validation(field+".usage_unit", "usage_unit must match %s", unitPattern).With("reason", "malformed_unit")
		}
		if err := checkCurrency(field+".currency", p.Currency); err != nil {
			return err
		}
		if _, err := ParseRate(field+".unit_price", p.UnitPrice, true); err != nil {
			return err
		}
		k := p.Unit + "/" + p.Currency
		if seen[k] {
			return apierr.Validation(field, "usage_unit and currency appear twice").With("reason", "duplicate_price")
		}
		seen[k] = true
	}
	return nil
}

func insertPrices(ctx context.Context, q *billingdb.Queries, versionID uuid.UUID, prices []PriceInput) error {
	p := billingdb.InsertPricesParams{VersionID: versionID}
	for _, in := range prices {
		d, _ := ParseRate("", in.UnitPrice, true)
		p.Units = append(p.Units, in.Unit)
		p.Currencies = append(p.Currencies, in.Currency)
		p.Prices = append(p.Prices, d.Text('f'))
	}
	if err := q.InsertPrices(ctx, p); err != nil {
		return fmt.Errorf("insert prices: %w", err)
	}
	return nil
}

// CreatePlan creates a plan with its first version, effective at effectiveFrom (nil:
// now). A default plan prices every tenant without a plan of its own; making a plan the
// default takes the flag from the previous default.
func (s *Service) CreatePlan(ctx context.Context, name string, isDefault bool, effectiveFrom *time.Time, prices []PriceInput) (Plan, error) {
	if n := len([]rune(name)); n < 1 || n > 120 {
		return Plan{}, apierr.Validation("name", "name has 1 to 120 characters")
	}
	if err := validatePrices(prices); err != nil {
		return Plan{}, err
	}
	now := s.Clock.Now()
	eff := now
	if effectiveFrom != nil {
		eff = *effectiveFrom
	}
	var plan billingdb.BillingPricingPlan
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := billingdb.New(tx)
		var err error
		id := s.IDs.New()
		if isDefault {
			if err := q.ClearDefaultPlan(ctx, billingdb.ClearDefaultPlanParams{UpdatedAt: now, ID: id}); err != nil {
				return fmt.Errorf("clear default plan: %w", err)
			}
		}
		plan, err = q.InsertPricingPlan(ctx, billingdb.InsertPricingPlanParams{ID: id, Name: name, IsDefault: isDefault, CreatedAt: now})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.InvalidRequest, "a pricing plan with this name exists").WithStatus(409).
				With("reason", "duplicate_name").With("field", "name")
		}
		if err != nil {
			return fmt.Errorf("insert plan: %w", err)
		}
		v, err := q.InsertPlanVersion(ctx, billingdb.InsertPlanVersionParams{ID: s.IDs.New(), PlanID: id, Version: 1, EffectiveFrom: eff, CreatedAt: now})
		if err != nil {
			return fmt.Errorf("insert plan version: %w", err)
		}
		if err := insertPrices(ctx, q, v.ID, prices); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.pricing_plan.create", TargetType: "pricing_plan", TargetID: id.String(),
			Metadata: map[string]any{"name": name, "is_default": isDefault, "prices": len(prices)},
		})
	})
	if err != nil {
		return Plan{}, err
	}
	return s.GetPlan(ctx, plan.ID)
}

// NewPlanVersion adds the next version of a plan. It takes effect at effectiveFrom (nil:
// now), which may not lie in the past or before the latest version: rated usage is never
// revalued.
func (s *Service) NewPlanVersion(ctx context.Context, planID uuid.UUID, effectiveFrom *time.Time, prices []PriceInput) (Plan, error) {
	if err := validatePrices(prices); err != nil {
		return Plan{}, err
	}
	now := s.Clock.Now()
	eff := now
	if effectiveFrom != nil {
		eff = *effectiveFrom
	}
	if eff.Before(now) {
		return Plan{}, apierr.Validation("effective_from", "effective_from may not lie in the past").With("reason", "in_past")
	}
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := billingdb.New(tx)
		if _, err := q.GetPricingPlanForUpdate(ctx, planID); errors.Is(err, pgx.ErrNoRows) {
			return planNotFound()
		} else if err != nil {
			return fmt.Errorf("lock plan: %w", err)
		}
		versions, err := q.PlanVersions(ctx, planID)
		if err != nil {
			return fmt.Errorf("plan versions: %w", err)
		}
		last := versions[len(versions)-1]
		if !eff.After(last.EffectiveFrom) {
			return apierr.Validation("effective_from", "effective_from must follow the latest version's").With("reason", "not_after_latest")
		}
		v, err := q.InsertPlanVersion(ctx, billingdb.InsertPlanVersionParams{
			ID: s.IDs.New(), PlanID: planID, Version: last.Version + 1, EffectiveFrom: eff, CreatedAt: now,
		})
		if err != nil {
			return fmt.Errorf("insert plan version: %w", err)
		}
		if err := insertPrices(ctx, q, v.ID, prices); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.pricing_plan.version", TargetType: "pricing_plan", TargetID: planID.String(),
			Metadata: map[string]any{"version": v.Version, "effective_from": eff, "prices": len(prices)},
		})
	})
	if err != nil {
		return Plan{}, err
	}
	return s.GetPlan(ctx, planID)
}

func planNotFound() *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "pricing plan not found").WithStatus(404).With("reason", "not_found")
}

// GetPlan loads a plan with its versions.
func (s *Service) GetPlan(ctx context.Context, id uuid.UUID) (Plan, error) {
	q := s.read(ctx)
	p, err := q.GetPricingPlan(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Plan{}, planNotFound()
	}
	if err != nil {
		return Plan{}, fmt.Errorf("load plan: %w", err)
	}
	return s.planView(ctx, q, p)
}

func (s *Service) planView(ctx context.Context, q *billingdb.Queries, p billingdb.BillingPricingPlan) (Plan, error) {
	versions, err := q.PlanVersions(ctx, p.ID)
	if err != nil {
		return Plan{}, fmt.Errorf("plan versions: %w", err)
	}
	prices, err := q.PlanPrices(ctx, p.ID)
	if err != nil {
		return Plan{}, fmt.Errorf("plan prices: %w", err)
	}
	out := Plan{ID: p.ID, Name: p.Name, IsDefault: p.IsDefault, CreatedAt: p.CreatedAt}
	for _, v := range versions {
		pv := PlanVersion{Version: v.Version, EffectiveFrom: v.EffectiveFrom, CreatedAt: v.CreatedAt, Prices: []PriceInput{}}
		for _, pr := range prices {
			if pr.VersionID == v.ID {
				pv.Prices = append(pv.Prices, PriceInput{Unit: pr.UsageUnit, Currency: pr.Currency, UnitPrice: pr.UnitPrice})
			}
		}
		out.Versions = append(out.Versions, pv)
	}
	return out, nil
}

// ListPlans lists up to 100 plans by name.
func (s *Service) ListPlans(ctx context.Context) ([]Plan, error) {
	q := s.read(ctx)
	plans, err := q.ListPricingPlans(ctx, 100)
	if err != nil {
		return nil, fmt.Errorf("list plans: %w", err)
	}
	out := []Plan{}
	for _, p := range plans {
		v, err := s.planView(ctx, q, p)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// priceVersion is the price of one unit in one currency under one plan version.
type priceVersion struct {
	planID        uuid.UUID
	planName      string
	version       int32
	effectiveFrom time.Time
	price         *apd.Decimal
	priceText     string
}

// schedule is a plan's versions with their prices, loaded once per rating batch.
type schedule struct {
	plan     billingdb.BillingPricingPlan
	versions []billingdb.BillingPricingPlanVersion
	prices   map[uuid.UUID]map[string]string // version id -> unit/currency -> price
}

// priceAt answers the price of unit in currency in force at t and when the next
// version takes effect (zero: none).
func (sc *schedule) priceAt(unit, currency string) func(time.Time) (*priceVersion, time.Time, error) {
	return func(t time.Time) (*priceVersion, time.Time, error) {
		idx := -1
		for i, v := range sc.versions {
			if !v.EffectiveFrom.After(t) {
				idx = i
			}
		}
		if idx < 0 {
			return nil, time.Time{}, errNoPrice(unit, currency)
		}
		v := sc.versions[idx]
		text, ok := sc.prices[v.ID][unit+"/"+currency]
		if !ok {
			return nil, time.Time{}, errNoPrice(unit, currency)
		}
		d, _, err := apd.NewFromString(text)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("stored price %q: %w", text, err)
		}
		var next time.Time
		if idx+1 < len(sc.versions) {
			next = sc.versions[idx+1].EffectiveFrom
		}
		return &priceVersion{planID: sc.plan.ID, planName: sc.plan.Name, version: v.Version, effectiveFrom: v.EffectiveFrom,
			price: d, priceText: text}, next, nil
	}
}

// ErrNoPrice is wrapped when no price exists for a unit and currency.
var ErrNoPrice = errors.New("billing: no price")

func errNoPrice(unit, currency string) error {
	return apierr.Validation("usage_unit", "no price for %s in %s", unit, currency).With("reason", "no_price").Wrap(ErrNoPrice)
}

// pricer resolves tenants' plans, caching for one batch.
type pricer struct {
	q       *billingdb.Queries
	tenants map[uuid.UUID]uuid.UUID
	plans   map[uuid.UUID]*schedule
}

func newPricer(q *billingdb.Queries) *pricer {
	return &pricer{q: q, tenants: map[uuid.UUID]uuid.UUID{}, plans: map[uuid.UUID]*schedule{}}
}

func (p *pricer) forTenant(ctx context.Context, tenantID uuid.UUID) (*schedule, error) {
	planID, ok := p.tenants[tenantID]
	if !ok {
		acct, err := p.q.GetBillingAccount(ctx, tenantID)
		switch {
		case err == nil && acct.CustomerPricingPlanID.Valid:
			planID = acct.CustomerPricingPlanID.UUID
		case err == nil || errors.Is(err, pgx.ErrNoRows):
			def, err := p.q.DefaultPricingPlan(ctx)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, apierr.Validation("usage_unit", "no pricing plan applies").With("reason", "no_pricing_plan").Wrap(ErrNoPrice)
			}
			if err != nil {
				return nil, fmt.Errorf("default plan: %w", err)
			}
			planID = def.ID
		default:
			return nil, fmt.Errorf("billing account: %w", err)
		}
		p.tenants[tenantID] = planID
	}
	return p.plan(ctx, planID)
}

// forPlanOrDefault is the schedule of planID, or of the default plan when planID is
// not valid (an end customer's wholesale plan left unset).
func (p *pricer) forPlanOrDefault(ctx context.Context, planID uuid.NullUUID) (*schedule, error) {
	if planID.Valid {
		return p.plan(ctx, planID.UUID)
	}
	def, err := p.q.DefaultPricingPlan(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, apierr.Validation("usage_unit", "no pricing plan applies").With("reason", "no_pricing_plan").Wrap(ErrNoPrice)
	}
	if err != nil {
		return nil, fmt.Errorf("default plan: %w", err)
	}
	return p.plan(ctx, def.ID)
}

func (p *pricer) plan(ctx context.Context, planID uuid.UUID) (*schedule, error) {
	if sc, ok := p.plans[planID]; ok {
		return sc, nil
	}
	plan, err := p.q.GetPricingPlan(ctx, planID)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	versions, err := p.q.PlanVersions(ctx, planID)
	if err != nil {
		return nil, fmt.Errorf("plan versions: %w", err)
	}
	prices, err := p.q.PlanPrices(ctx, planID)
	if err != nil {
		return nil, fmt.Errorf("plan prices: %w", err)
	}
	sc := &schedule{plan: plan, versions: versions, prices: map[uuid.UUID]map[string]string{}}
	for _, pr := range prices {
		if sc.prices[pr.VersionID] == nil {
			sc.prices[pr.VersionID] = map[string]string{}
		}
		sc.prices[pr.VersionID][pr.UsageUnit+"/"+pr.Currency] = pr.UnitPrice
	}
	p.plans[planID] = sc
	return sc, nil
}

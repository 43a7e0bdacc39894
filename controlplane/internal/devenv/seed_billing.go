package devenv

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
)

// DemoCredit is the demo tenant's starting balance in its default currency's minor
// units ($500.00 for USD).
const DemoCredit = 50_000

// demoCreditReference makes the starting credit one ledger posting however often the
// seed runs.
const demoCreditReference = "devenv:demo-credit"

// devPrices is the development price book: GPU-seconds of the mock fleet's SKUs.
var devPrices = []billing.PriceInput{
	{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.000694444444"}, // $2.50 per GPU-hour
	{Unit: "gpu.h100", Currency: "EUR", UnitPrice: "0.000638888889"},
	{Unit: "gpu.a100", Currency: "USD", UnitPrice: "0.000416666667"}, // $1.50 per GPU-hour
	{Unit: "gpu.a100", Currency: "EUR", UnitPrice: "0.000383333333"},
}

// seedBilling gives the dev platform a default pricing plan (when it has none) and the
// demo tenant its starting balance through a real ledger posting: an admin credit
// adjustment, posted once (the reference makes re-runs replays).
func seedBilling(ctx context.Context, pool *pgxpool.Pool, in SeedInput, s *Seeded) error {
	svc := billing.New(pool, in.Clock, in.IDs, billing.Config{})
	if _, err := billingdb.New(pool).DefaultPricingPlan(ctx); errors.Is(err, pgx.ErrNoRows) {
		if _, err := svc.CreatePlan(ctx, "dev", true, nil, devPrices); err != nil {
			return fmt.Errorf("dev pricing plan: %w", err)
		}
		s.Changes = append(s.Changes, "created the default pricing plan \"dev\"")
	} else if err != nil {
		return fmt.Errorf("default pricing plan: %w", err)
	}
	cur, err := billingdb.New(pool).TenantDefaultCurrency(ctx, s.TenantID)
	if err != nil {
		return fmt.Errorf("demo currency: %w", err)
	}
	p, err := svc.Adjust(ctx, billing.Adjustment{
		TenantID: s.TenantID, Money: billing.Money{AmountMinor: DemoCredit, Currency: cur},
		Reason: "make dev starting credit", Reference: demoCreditReference,
	})
	if err != nil {
		return fmt.Errorf("demo credit: %w", err)
	}
	if !p.Replayed {
		s.Changes = append(s.Changes, fmt.Sprintf("credited the demo tenant %d %s minor units", DemoCredit, cur))
	}
	return nil
}

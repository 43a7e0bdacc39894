package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/loop"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Runway events (outbox; subjects "gantry.events.<type>").
const (
	EventRunwayExhausted = "billing.runway_exhausted"
	EventRunwayRestored  = "billing.runway_restored"
)

// Runway is where a wallet stands: its balance, the usage its open runs have consumed
// but that is not rated yet (pending), and the running burn per second.
type Runway struct {
	TenantID  uuid.UUID
	Currency  string
	Balance   int64
	Pending   int64
	Burn      *apd.Decimal // currency units (major) per second of the open runs
	Runs      []UsageRecord
	Available int64 // Balance - Pending
}

// Duration is how long Available lasts at burn plus extra (per second); -1 means forever.
func (r Runway) Duration(extra *apd.Decimal) time.Duration {
	var burn apd.Decimal
	_, _ = decimalCtx.Add(&burn, r.Burn, extra)
	if burn.Sign() <= 0 {
		return -1
	}
	if r.Available <= 0 {
		return 0
	}
	avail := apd.New(r.Available, -int32(exponents[r.Currency]))
	var secs apd.Decimal
	_, _ = decimalCtx.Quo(&secs, avail, &burn)
	f, _ := secs.Float64() // display only: a duration, not money
	if f > float64(1<<62)/1e9 {
		return time.Duration(1 << 62)
	}
	return time.Duration(f * float64(time.Second))
}

// need is the minor units that cover d at burn (rounded up).
func need(burn *apd.Decimal, d time.Duration, exp int) int64 {
	var v apd.Decimal
	_, _ = decimalCtx.Mul(&v, burn, apd.New(d.Milliseconds(), -3))
	_, _ = decimalCtx.Mul(&v, &v, apd.New(1, int32(exp)))
	c := *decimalCtx
	c.Rounding = apd.RoundCeiling
	var r apd.Decimal
	_, _ = c.Quantize(&r, &v, 0)
	n, _ := r.Int64()
	return n
}

// runwayOf computes the runway of one wallet with q at now.
func (s *Service) runwayOf(ctx context.Context, q *billingdb.Queries, pr *pricer, tenantID uuid.UUID, currency string, now time.Time) (Runway, error) {
	r := Runway{TenantID: tenantID, Currency: currency, Burn: apd.New(0, 0)}
	bal, err := q.WalletBalance(ctx, billingdb.WalletBalanceParams{TenantID: nullUUID(tenantID), Currency: currency})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("wallet: %w", err)
	}
	r.Balance = bal
	runs, err := q.OpenUsage(ctx, billingdb.OpenUsageParams{TenantID: tenantID, Currency: currency})
	if err != nil {
		return r, fmt.Errorf("open usage: %w", err)
	}
	r.Runs = runs
	var sc *schedule
	if len(runs) > 0 {
		if sc, err = pr.forTenant(ctx, tenantID); err != nil {
			return r, err
		}
	}
	exp := exponents[currency]
	at := now.UTC().Truncate(time.Millisecond)
	for _, run := range runs {
		priceAt := sc.priceAt(run.UsageUnit, currency)
		if at.After(run.RatedThrough) {
			st := runState{ratedThrough: run.RatedThrough, segFrom: run.SegFrom, segUnits: run.SegUnits, segAmount: run.SegAmountMinor}
			pieces, _, err := ratePieces(run.BillFrom, run.Quantity, exp, st, at, priceAt)
			if err != nil {
				return r, err
			}
			for _, p := range pieces {
				r.Pending += p.amount
			}
		}
		pv, _, err := priceAt(at)
		if err != nil {
			return r, err
		}
		var b apd.Decimal
		_, _ = decimalCtx.Mul(&b, pv.price, apd.New(run.Quantity, 0))
		_, _ = decimalCtx.Add(r.Burn, r.Burn, &b)
	}
	r.Available = r.Balance - r.Pending
	return r, nil
}

// RunwayAt is the runway of the tenant's wallet in currency at now, computed exactly as
// launch checks and the runway watcher compute it (runwayOf), for read models that show
// it (docs/operations.md, "Cost projection"). It writes nothing.
func (s *Service) RunwayAt(ctx context.Context, tenantID uuid.UUID, currency string, now time.Time) (Runway, error) {
	q := s.read(ctx)
	return s.runwayOf(ctx, q, newPricer(q), tenantID, currency, now)
}

// Decision is the answer of CanLaunch.
type Decision struct {
	Allowed  bool
	Currency string
	// Available is balance minus pending (unrated running) usage; Required is what the
	// minimum runway costs at the running burn plus the new launch's.
	Available int64
	Required  int64
	Balance   int64
	Pending   int64
	// Runway is how long Available lasts with the launch (-1: forever).
	Runway    time.Duration
	MinRunway time.Duration
	// UnitPrice is the price of one unit of the launch's usage unit in Currency (exact
	// decimal, major units) under PlanVersion of PlanID, the version in force: what the
	// launch will be billed at, so the launch needs no price read of its own.
	UnitPrice   string
	PlanID      uuid.UUID
	PlanVersion int32
	// Arrears is what the tenant's receivable in Currency owes: a tenant in arrears
	// cannot launch until money settles them.
	Arrears int64
}

// Err is nil when allowed, else insufficient_balance (402) with the figures in details.
func (d Decision) Err() error {
	if d.Allowed {
		return nil
	}
	if d.Arrears > 0 {
		return apierr.New(apierr.InsufficientBalance, "the tenant is in arrears: %d minor units of %s usage are unpaid; a top-up settles them first", d.Arrears, d.Currency).
			With("reason", "arrears").With("currency", d.Currency).With("arrears_minor", d.Arrears)
	}
	return apierr.New(apierr.InsufficientBalance, "the %s balance does not cover the minimum runway of %s", d.Currency, d.MinRunway).
		With("currency", d.Currency).With("available_minor", d.Available).With("required_minor", d.Required).
		With("min_runway_seconds", int64(d.MinRunway/time.Second))
}

// CanLaunch answers whether the tenant may start quantity units of usageUnit (e.g. 8 ×
// "gpu.h100") in project projectID, billed in currency ("" = the tenant's default): the
// wallet's balance minus its pending (unrated running) usage must cover the minimum
// runway (GANTRY_BILLING_MIN_RUNWAY, default 1h) at the running burn plus the new
// launch's. It writes nothing. A refusal is Decision.Allowed false; Decision.Err() is
// the insufficient_balance error the launch path returns. A unit without a price is a
// validation_error (reason no_price).
//
// One statement reads the currency, the price in force and the balance (LaunchPricing);
// the open runs and the plan's schedule are read only when the wallet has open runs.
func (s *Service) CanLaunch(ctx context.Context, tenantID, projectID uuid.UUID, usageUnit string, quantity int64, currency string) (Decision, error) {
	_ = projectID // budgets decide per project; the wallet is the tenant's
	if quantity < 1 {
		quantity = 1
	}
	q := s.read(ctx)
	now := s.Clock.Now()
	lp, err := q.LaunchPricing(ctx, billingdb.LaunchPricingParams{TenantID: tenantID, Currency: currency, UsageUnit: usageUnit, At: now})
	if err != nil {
		return Decision{}, fmt.Errorf("launch pricing: %w", err)
	}
	if lp.Currency == "" {
		return Decision{}, fmt.Errorf("tenant currency: %w", pgx.ErrNoRows)
	}
	currency = lp.Currency
	if err := checkCurrency("currency", currency); err != nil {
		return Decision{}, err
	}
	if !lp.HasPlan {
		return Decision{}, apierr.Validation("usage_unit", "no pricing plan applies").With("reason", "no_pricing_plan").Wrap(ErrNoPrice)
	}
	if lp.UnitPrice == "" {
		return Decision{}, errNoPrice(usageUnit, currency)
	}
	price, _, err := apd.NewFromString(lp.UnitPrice)
	if err != nil {
		return Decision{}, fmt.Errorf("stored price %q: %w", lp.UnitPrice, err)
	}
	rw := Runway{TenantID: tenantID, Currency: currency, Balance: lp.BalanceMinor, Burn: apd.New(0, 0), Available: lp.BalanceMinor}
	// The wallet that pays: an end customer whose reseller carries the credit risk
	// launches on its reseller's wallet (docs/billing-accounts.md), priced here at the
	// customer's price, never below the wholesale one.
	payer := tenantID
	if err := s.Pool.QueryRow(ctx, `SELECT reseller_tenant_id FROM billing_accounts
		WHERE tenant_id = $1 AND account_type = 'end_customer' AND credit_risk_owner = 'reseller' AND status <> 'deleted'`,
		tenantID).Scan(&payer); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Decision{}, fmt.Errorf("credit risk owner: %w", err)
	}
	if lp.OpenUsage || payer != tenantID {
		if rw, err = s.runwayOf(ctx, q, newPricer(q), payer, currency, now); err != nil {
			return Decision{}, err
		}
	}
	var extra apd.Decimal
	_, _ = decimalCtx.Mul(&extra, price, apd.New(quantity, 0))
	var total apd.Decimal
	_, _ = decimalCtx.Add(&total, rw.Burn, &extra)
	d := Decision{
		Currency: currency, Available: rw.Available, Balance: rw.Balance, Pending: rw.Pending,
		Required: need(&total, s.Config.MinRunway, exponents[currency]), Runway: rw.Duration(&extra), MinRunway: s.Config.MinRunway,
		UnitPrice: lp.UnitPrice, PlanID: lp.PlanID, PlanVersion: lp.PlanVersion,
	}
	if d.Arrears, err = s.Ledger.Arrears(ctx, s.Pool, payer, currency); err != nil {
		return Decision{}, fmt.Errorf("arrears: %w", err)
	}
	d.Allowed = d.Available >= d.Required && d.Available >= 0 && d.Arrears == 0
	return d, nil
}

// WatchRunway checks every wallet with open runs and every blocked wallet. A wallet
// whose runway fell under the floor (GANTRY_BILLING_RUNWAY_FLOOR) is blocked once:
// event billing.runway_exhausted asks for the tenant's running workloads in that
// currency to be stopped before the balance runs out. A blocked wallet whose available
// balance covers the minimum runway again (after a top-up) is unblocked with
// billing.runway_restored. It returns how many wallets it blocked and unblocked.
func (s *Service) WatchRunway(ctx context.Context) (blocked, restored int, err error) {
	q := s.read(ctx)
	wallets, err := q.WalletsWithOpenUsage(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("wallets: %w", err)
	}
	for _, w := range wallets {
		var did bool
		err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
			var err error
			did, err = s.blockIfExhausted(ctx, tx, w.TenantID, w.Currency)
			return err
		})
		if err != nil {
			return blocked, restored, err
		}
		if did {
			blocked++
		}
	}
	blocks, err := q.RunwayBlocks(ctx)
	if err != nil {
		return blocked, restored, fmt.Errorf("runway blocks: %w", err)
	}
	for _, b := range blocks {
		var did bool
		err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
			var err error
			did, err = s.liftIfRestored(ctx, tx, b.TenantID, b.Currency)
			return err
		})
		if err != nil {
			return blocked, restored, err
		}
		if did {
			restored++
		}
	}
	return blocked, restored, nil
}

func (s *Service) blockIfExhausted(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string) (bool, error) {
	q := billingdb.New(tx)
	// An end customer whose reseller carries the credit risk never pays from its own
	// wallet (docs/billing-accounts.md): its empty wallet is no reason to stop it; the
	// reseller owes its usage.
	var resellerRisk bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM billing_accounts WHERE tenant_id = $1
		AND account_type = 'end_customer' AND credit_risk_owner = 'reseller' AND status <> 'deleted')`, tenantID).Scan(&resellerRisk); err != nil {
		return false, fmt.Errorf("credit risk owner: %w", err)
	}
	if resellerRisk {
		return false, nil
	}
	rw, err := s.runwayOf(ctx, q, newPricer(q), tenantID, currency, s.Clock.Now())
	if err != nil {
		return false, err
	}
	left := rw.Duration(apd.New(0, 0))
	if len(rw.Runs) == 0 || left < 0 || left >= s.Config.RunwayFloor {
		return false, nil
	}
	n, err := q.InsertRunwayBlock(ctx, billingdb.InsertRunwayBlockParams{
		TenantID: tenantID, Currency: currency, BlockedAt: s.Clock.Now(), BurnPerSecond: rw.Burn.Text('f'),
	})
	if err != nil || n == 0 {
		return false, err
	}
	var runs []map[string]any
	for i, r := range rw.Runs {
		if i == 1000 {
			break
		}
		run := map[string]any{"usage_record_id": r.ID.String(), "source": r.Source, "source_id": r.SourceID.String()}
		if r.ProjectID.Valid {
			run["project_id"] = r.ProjectID.UUID.String()
		}
		runs = append(runs, run)
	}
	payload := map[string]any{
		"tenant_id": tenantID.String(), "currency": currency, "balance_minor": rw.Balance, "pending_minor": rw.Pending,
		"available_minor": rw.Available, "runway_seconds": int64(left / time.Second),
		"floor_seconds": int64(s.Config.RunwayFloor / time.Second), "action": "stop_running_workloads", "runs": runs,
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: EventRunwayExhausted, Subject: "gantry.events." + EventRunwayExhausted, Payload: payload}); err != nil {
		return false, err
	}
	return true, s.Audit.Record(ctx, tx, audit.Entry{
		Action: "billing.runway.exhausted", TargetType: "wallet", TargetID: tenantID.String() + "/" + currency, TenantID: tenantID,
		ActorType: audit.ActorSystem, Metadata: map[string]any{"currency": currency, "available_minor": rw.Available},
	})
}

// liftIfRestored unblocks the wallet when its available balance covers the minimum
// runway at the burn it had when blocked (or at its current burn, if higher).
func (s *Service) liftIfRestored(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string) (bool, error) {
	q := billingdb.New(tx)
	b, err := q.GetRunwayBlock(ctx, billingdb.GetRunwayBlockParams{TenantID: tenantID, Currency: currency})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("runway block: %w", err)
	}
	rw, err := s.runwayOf(ctx, q, newPricer(q), tenantID, currency, s.Clock.Now())
	if err != nil {
		return false, err
	}
	burn, _, err := apd.NewFromString(b.BurnPerSecond)
	if err != nil {
		return false, fmt.Errorf("stored burn: %w", err)
	}
	if rw.Burn.Cmp(burn) > 0 {
		burn = rw.Burn
	}
	if rw.Available <= 0 || rw.Available < need(burn, s.Config.MinRunway, exponents[currency]) {
		return false, nil
	}
	if n, err := q.DeleteRunwayBlock(ctx, billingdb.DeleteRunwayBlockParams{TenantID: tenantID, Currency: currency}); err != nil || n == 0 {
		return false, err
	}
	payload := map[string]any{"tenant_id": tenantID.String(), "currency": currency, "balance_minor": rw.Balance, "available_minor": rw.Available}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: EventRunwayRestored, Subject: "gantry.events." + EventRunwayRestored, Payload: payload}); err != nil {
		return false, err
	}
	return true, s.Audit.Record(ctx, tx, audit.Entry{
		Action: "billing.runway.restored", TargetType: "wallet", TargetID: tenantID.String() + "/" + currency, TenantID: tenantID,
		ActorType: audit.ActorSystem, Metadata: map[string]any{"currency": currency, "available_minor": rw.Available},
	})
}

// liftBlockIfRestored runs after a wallet credit; a pricing problem must never fail a
// top-up (the watcher retries the lift on its next pass).
func (s *Service) liftBlockIfRestored(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string) error {
	_, err := s.liftIfRestored(ctx, tx, tenantID, currency)
	if errors.Is(err, ErrNoPrice) {
		return nil
	}
	return err
}

// Run is billing's background loop: every WatchInterval it rates running usage (so
// balances move while workloads run) and then checks runways, even when rating failed.
// Every step is idempotent and safe on every replica.
func (s *Service) Run(ctx context.Context, log *slog.Logger) {
	loop.Every(ctx, s.Config.WatchInterval, log, "billing pass", func(ctx context.Context) error {
		var errs []error
		if _, err := s.RateRunning(ctx, s.Clock.Now(), 500); err != nil {
			errs = append(errs, fmt.Errorf("rate running usage: %w", err))
		}
		if _, _, err := s.WatchRunway(ctx); err != nil {
			errs = append(errs, fmt.Errorf("runway watch: %w", err))
		}
		return errors.Join(errs...)
	})
}

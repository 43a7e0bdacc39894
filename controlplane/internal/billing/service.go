package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Config is billing's configuration (GANTRY_BILLING_* in app.Config).
type Config struct {
	// MinRunway is how long a new launch must be able to run on the wallet (default 1h).
	MinRunway time.Duration
	// RunwayFloor: below it the watcher asks for the tenant's running workloads to stop
	// (default 10m).
	RunwayFloor time.Duration
	// WatchInterval is the period of the background loop (rating running usage, runway).
	WatchInterval time.Duration
}

func (c Config) withDefaults() Config {
	if c.MinRunway <= 0 {
		c.MinRunway = time.Hour
	}
	if c.RunwayFloor <= 0 {
		c.RunwayFloor = 10 * time.Minute
	}
	if c.WatchInterval <= 0 {
		c.WatchInterval = 30 * time.Second
	}
	return c
}

// Service is billing: balances, FX evidence, pricing, usage and rating, runway. Ledger
// is its ledger.
type Service struct {
	Pool   *pgxpool.Pool
	Clock  clock.Clock
	IDs    ids.Source
	Config Config
	Ledger *Ledger
	Audit  *audit.Log
	Outbox *outbox.Writer
}

// New assembles billing.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cfg Config) *Service {
	s := &Service{
		Pool: pool, Clock: clk, IDs: idSrc, Config: cfg.withDefaults(),
		Ledger: &Ledger{Pool: pool, Clock: clk, IDs: idSrc},
		Audit:  &audit.Log{Clock: clk, IDs: idSrc},
		Outbox: &outbox.Writer{Clock: clk, IDs: idSrc},
	}
	s.Ledger.afterCredit = s.liftBlockIfRestored
	return s
}

func (s *Service) read(ctx context.Context) *billingdb.Queries {
	if tx, ok := db.TxFrom(ctx); ok {
		return billingdb.New(tx)
	}
	return billingdb.New(s.Pool)
}

// Spent is the rated spend (minor units of currency only, never converted) of the tenant,
// or of one project when projectID is non-nil, over rated lines with bill_from in
// [from, to).
func (s *Service) Spent(ctx context.Context, tenantID uuid.UUID, projectID *uuid.UUID, currency string, from, to time.Time) (int64, error) {
	p := billingdb.SpentParams{TenantID: tenantID, Currency: currency, FromTime: from, ToTime: to}
	if projectID != nil {
		p.ProjectID = uuid.NullUUID{UUID: *projectID, Valid: true}
	}
	n, err := s.read(ctx).Spent(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("spent: %w", err)
	}
	return n, nil
}

// Money is an amount in minor units of its currency.
type Money struct {
	AmountMinor int64
	Currency    string
}

// Balances is the tenant's wallets, one per currency (ordered by currency), and the
// primary one: the wallet in the tenant's default currency (zero when it has none).
// Currencies are never summed.
type Balances struct {
	Primary Money
	All     []Money
}

// Balances loads the tenant's balances.
func (s *Service) Balances(ctx context.Context, tenantID uuid.UUID) (Balances, error) {
	q := s.read(ctx)
	def, err := q.TenantDefaultCurrency(ctx, tenantID)
	if err != nil {
		return Balances{}, fmt.Errorf("tenant currency: %w", err)
	}
	rows, err := q.TenantWallets(ctx, nullUUID(tenantID))
	if err != nil {
		return Balances{}, fmt.Errorf("wallets: %w", err)
	}
	out := Balances{Primary: Money{Currency: def}}
	for _, r := range rows {
		m := Money{AmountMinor: r.BalanceMinor, Currency: r.Currency}
		if r.Currency == def {
			out.Primary = m
		}
		out.All = append(out.All, m)
	}
	if !hasCurrency(out.All, def) {
		out.All = append([]Money{out.Primary}, out.All...)
	}
	return out, nil
}

func hasCurrency(ms []Money, c string) bool {
	for _, m := range ms {
		if m.Currency == c {
			return true
		}
	}
	return false
}

// Balance implements tenancy.BalanceSource: the primary display currency's wallet
// (never a sum of currencies). A caller outside a tenant gets 0 USD.
func (s *Service) Balance(ctx context.Context, tenantID uuid.UUID) (int64, string, error) {
	if tenantID == uuid.Nil {
		return 0, "USD", nil
	}
	b, err := s.Balances(ctx, tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "USD", nil
	}
	if err != nil {
		return 0, "", err
	}
	return b.Primary.AmountMinor, b.Primary.Currency, nil
}

// WalletBalance is the tenant's wallet in currency (0 when it has none).
func (s *Service) WalletBalance(ctx context.Context, tenantID uuid.UUID, currency string) (int64, error) {
	n, err := s.read(ctx).WalletBalance(ctx, billingdb.WalletBalanceParams{TenantID: nullUUID(tenantID), Currency: currency})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("wallet balance: %w", err)
	}
	return n, nil
}

// Adjustment is an admin credit (Amount > 0) or debit (< 0) of a tenant's wallet
// against the adjustments account.
type Adjustment struct {
	TenantID uuid.UUID
	Money    Money
	Reason   string
	// Reference makes the adjustment idempotent ("adjustment:<it>"); empty mints one.
	Reference string
	ActorID   uuid.UUID
}

// Adjust posts an admin adjustment with its audit row, and re-checks the wallet's runway
// (a credit may lift a runway block). Replayed is true when Reference was posted before.
func (s *Service) Adjust(ctx context.Context, a Adjustment) (Posted, error) {
	if err := checkCurrency("amount.currency", a.Money.Currency); err != nil {
		return Posted{}, err
	}
	if a.Money.AmountMinor == 0 {
		return Posted{}, apierr.Validation("amount.amount_minor", "amount must not be zero").With("reason", "zero_amount")
	}
	if _, err := s.read(ctx).TenantDefaultCurrency(ctx, a.TenantID); errors.Is(err, pgx.ErrNoRows) {
		return Posted{}, apierr.New(apierr.InvalidRequest, "tenant not found").WithStatus(404).With("reason", "not_found").With("field", "tenant_id")
	} else if err != nil {
		return Posted{}, fmt.Errorf("tenant: %w", err)
	}
	ref := a.Reference
	if ref == "" {
		ref = s.IDs.New().String()
	}
	var out Posted
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		legs := []Leg{{Account: AccountKey{Kind: AccountWallet, TenantID: a.TenantID, Currency: a.Money.Currency}, Amount: a.Money.AmountMinor}}
		if a.Money.AmountMinor > 0 {
			// A credit settles the tenant's arrears first (docs/billing-accounts.md).
			var err error
			if legs, err = s.Ledger.ArrearsFirst(ctx, tx, a.TenantID, a.Money.Currency, a.Money.AmountMinor); err != nil {
				return err
			}
		}
		var err error
		out, err = s.Ledger.Post(ctx, tx, Posting{
			Kind: TxnAdjustment, TenantID: a.TenantID, Reference: "adjustment:" + ref, Memo: a.Reason, ActorUserID: a.ActorID,
			Legs: append(legs, Leg{Account: AccountKey{Kind: AccountAdjustments, Currency: a.Money.Currency}, Amount: -a.Money.AmountMinor}),
		})
		if err != nil || out.Replayed {
			return err
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.adjustment.create", TargetType: "ledger_transaction", TargetID: out.TxnID.String(), TenantID: a.TenantID,
			Metadata: map[string]any{"amount_minor": a.Money.AmountMinor, "currency": a.Money.Currency},
		}); err != nil {
			return err
		}
		return s.liftBlockIfRestored(ctx, tx, a.TenantID, a.Money.Currency)
	})
	return out, err
}

// ReverseTransaction reverses a ledger transaction (admin correction) with its audit row.
func (s *Service) ReverseTransaction(ctx context.Context, txnID uuid.UUID, reason string, actor uuid.UUID) (Posted, error) {
	var out Posted
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		if out, err = s.Ledger.Reverse(ctx, tx, txnID, reason, actor); err != nil || out.Replayed {
			return err
		}
		orig, err := billingdb.New(tx).GetTxn(ctx, txnID)
		if err != nil {
			return fmt.Errorf("load ledger transaction: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.ledger.reverse", TargetType: "ledger_transaction", TargetID: txnID.String(), TenantID: orig.TenantID.UUID,
			Metadata: map[string]any{"reversal_txn_id": out.TxnID.String()},
		})
	})
	return out, err
}

package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// FXSnapshot is immutable FX evidence: 1 unit of Source is Rate units of Target.
type FXSnapshot = billingdb.BillingFxSnapshot

// FXInput is an admin's FX snapshot.
type FXInput struct {
	Source, Target string
	Rate           string
	Provider       string
	ProviderRateID *string
	CapturedAt     time.Time
}

// RecordFXSnapshot stores an FX snapshot. Zero, negative and malformed rates are
// refused (validation_error). Recording the same snapshot again (same currencies,
// provider and captured_at) returns the stored one when the rate is equal and is a
// conflict otherwise: evidence is never overwritten. created reports a new row.
func (s *Service) RecordFXSnapshot(ctx context.Context, in FXInput) (snap FXSnapshot, created bool, err error) {
	if err := checkCurrency("source_currency", in.Source); err != nil {
		return snap, false, err
	}
	if err := checkCurrency("target_currency", in.Target); err != nil {
		return snap, false, err
	}
	if in.Source == in.Target {
		return snap, false, apierr.Validation("target_currency", "source and target currency must differ").With("reason", "same_currency")
	}
	rate, err := ParseRate("rate", in.Rate, false)
	if err != nil {
		return snap, false, err
	}
	if n := len(in.Provider); n < 1 || n > 64 {
		return snap, false, apierr.Validation("provider", "provider has 1 to 64 characters")
	}
	rateText := rate.Text('f')
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := billingdb.New(tx)
		snap, err = q.InsertFXSnapshot(ctx, billingdb.InsertFXSnapshotParams{
			ID: s.IDs.New(), SourceCurrency: in.Source, TargetCurrency: in.Target, Rate: rateText, Provider: in.Provider,
			ProviderRateID: in.ProviderRateID, CapturedAt: in.CapturedAt.UTC(), CreatedAt: s.Clock.Now(),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			snap, err = q.FXSnapshotByKey(ctx, billingdb.FXSnapshotByKeyParams{
				SourceCurrency: in.Source, TargetCurrency: in.Target, Provider: in.Provider, CapturedAt: in.CapturedAt.UTC(),
			})
			if err != nil {
				return fmt.Errorf("fx snapshot: %w", err)
			}
			prev, _, _ := apd.NewFromString(snap.Rate)
			if prev == nil || prev.Cmp(rate) != 0 {
				return apierr.New(apierr.InvalidRequest, "an FX snapshot with another rate was recorded for this time").
					WithStatus(409).With("reason", "fx_snapshot_conflict")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("fx snapshot: %w", err)
		}
		created = true
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.fx_snapshot.create", TargetType: "fx_snapshot", TargetID: snap.ID.String(),
			Metadata: map[string]any{"source_currency": in.Source, "target_currency": in.Target, "rate": rateText, "provider": in.Provider},
		})
	})
	return snap, created, err
}

// Conversion moves money between two of a tenant's wallets at an FX snapshot's rate.
type Conversion struct {
	TenantID    uuid.UUID
	From        string
	AmountMinor int64 // in From's minor units
	To          string
	SnapshotID  uuid.UUID
	Reference   string // idempotency; "" mints one
}

// Convert posts a conversion in tx: two legs per currency through the FX account (wallet
// From -a, FX From +a; FX To -b, wallet To +b), with b = a × rate rounded down to To's
// minor unit (a conversion never creates value). The transaction references the
// snapshot and is never revalued. It returns the posting and b.
func (l *Ledger) Convert(ctx context.Context, tx pgx.Tx, c Conversion) (Posted, int64, error) {
	if err := checkPositive("amount_minor", c.AmountMinor); err != nil {
		return Posted{}, 0, err
	}
	snap, err := billingdb.New(tx).GetFXSnapshot(ctx, c.SnapshotID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Posted{}, 0, apierr.New(apierr.InvalidRequest, "FX snapshot not found").WithStatus(404).With("reason", "not_found")
	}
	if err != nil {
		return Posted{}, 0, fmt.Errorf("fx snapshot: %w", err)
	}
	if snap.SourceCurrency != c.From || snap.TargetCurrency != c.To {
		return Posted{}, 0, apierr.Validation("fx_snapshot_id", "the snapshot converts %s to %s", snap.SourceCurrency, snap.TargetCurrency).
			With("reason", "fx_snapshot_mismatch")
	}
	rate, _, err := apd.NewFromString(snap.Rate)
	if err != nil {
		return Posted{}, 0, fmt.Errorf("stored rate: %w", err)
	}
	target, err := convertMinor(c.AmountMinor, exponents[c.From], rate, exponents[c.To])
	if err != nil {
		return Posted{}, 0, err
	}
	if target <= 0 {
		return Posted{}, 0, apierr.Validation("amount_minor", "the amount converts to nothing").With("reason", "too_small")
	}
	ref := c.Reference
	if ref == "" {
		ref = l.IDs.New().String()
	}
	p, err := l.Post(ctx, tx, Posting{
		Kind: TxnConversion, TenantID: c.TenantID, Reference: "conversion:" + ref, FXSnapshotID: snap.ID,
		Legs: []Leg{
			{Account: AccountKey{Kind: AccountWallet, TenantID: c.TenantID, Currency: c.From}, Amount: -c.AmountMinor},
			{Account: AccountKey{Kind: AccountFX, Currency: c.From}, Amount: c.AmountMinor},
			{Account: AccountKey{Kind: AccountFX, Currency: c.To}, Amount: -target},
			{Account: AccountKey{Kind: AccountWallet, TenantID: c.TenantID, Currency: c.To}, Amount: target},
		},
	})
	return p, target, err
}

// convertMinor is amount (minor units at fromExp) × rate in minor units at toExp,
// rounded down.
func convertMinor(amount int64, fromExp int, rate *apd.Decimal, toExp int) (int64, error) {
	var v apd.Decimal
	if _, err := decimalCtx.Mul(&v, apd.New(amount, int32(toExp-fromExp)), rate); err != nil {
		return 0, err
	}
	c := *decimalCtx
	c.Rounding = apd.RoundDown
	var r apd.Decimal
	if _, err := c.Quantize(&r, &v, 0); err != nil {
		return 0, err
	}
	n, err := r.Int64()
	if err != nil {
		return 0, apierr.Validation("amount_minor", "the converted amount is out of range")
	}
	return n, nil
}

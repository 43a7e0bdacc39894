package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/paymentsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// RefundRequestInput is an admin's refund request.
type RefundRequestInput struct {
	PaymentID   uuid.UUID
	Currency    string
	AmountMinor int64
	Reason      *string
	RequestedBy uuid.UUID
}

// Refund refunds part or all of a captured payment. Everything happens in one
// transaction that holds the payment row lock, so concurrent refunds of one payment run
// one after the other and together never exceed captured minus refunded:
//
//  1. checks, in this order: the payment exists (404), holds captured money
//     (409 payment_not_refundable), is inside the refund window counted from capture
//     (refund_window_exceeded: exactly the window is still inside), the currency is the
//     payment's (422), and the amount fits in captured minus refunded (409
//     refund_exceeds_captured);
//  2. the wallet is debited (insufficient_balance when the money was already spent);
//  3. the provider refunds (idempotency key = refund id). A refusal rolls everything
//     back: no refund is recorded and the wallet is untouched;
//  4. the refund, the payment's new state, the payment.refunded event and the audit row
//     are written and commit together.
//
// The provider call inside the transaction is deliberate: the row lock is what makes
// concurrent refunds safe, and the provider's charge.refunded webhook (cumulative
// amount) repairs the one case this cannot cover, a commit lost after the provider
// refunded.
func (s *Service) Refund(ctx context.Context, in RefundRequestInput) (Refund, Payment, error) {
	if err := s.validateAmount("amount", in.Currency, in.AmountMinor); err != nil {
		return Refund{}, Payment{}, err
	}
	// A plain read first, only to find the lock key (the payment's provider object, the
	// key webhooks of the payment use too).
	cur, err := s.Get(ctx, in.PaymentID)
	if err != nil {
		return Refund{}, Payment{}, err
	}
	key := "payment:" + cur.ID.String()
	if cur.ProviderPaymentID != nil {
		key = cur.Provider + ":" + *cur.ProviderPaymentID
	}
	defer s.paymentLocks.lock(key)()
	wctx, cancel := context.WithTimeout(ctx, workTimeout)
	defer cancel()
	var (
		ref Refund
		out Payment
	)
	err = db.InTx(wctx, s.Pool, func(tx pgx.Tx) error {
		ctx := wctx
		q := paymentsdb.New(tx)
		p, err := q.LockPayment(ctx, in.PaymentID)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("payment")
		}
		if err != nil {
			return fmt.Errorf("lock payment: %w", err)
		}
		if err := s.checkRefund(p, in); err != nil {
			return err
		}
		prov, ok := s.provider(p.Provider)
		if !ok || p.ProviderPaymentID == nil {
			return apierr.Internal(fmt.Errorf("payment %s has no provider object", p.ID))
		}
		rec := refundRecord{id: s.IDs.New(), amount: in.AmountMinor, origin: "admin", reason: in.Reason, requestedBy: in.RequestedBy}
		// The wallet first: when it cannot cover the refund, the provider is never asked.
		txn, err := s.Wallet.DebitRefund(ctx, tx, p.TenantID, p.Currency, in.AmountMinor, rec.id)
		if err != nil {
			return err
		}
		pr, err := prov.Refund(ctx, RefundRequest{
			RefundID: rec.id, PaymentID: p.ID, ProviderPaymentID: *p.ProviderPaymentID,
			Currency: p.Currency, AmountMinor: in.AmountMinor,
		})
		if err != nil {
			s.Log.WarnContext(ctx, "payment provider refused a refund", "payment_id", p.ID, "refund_id", rec.id, "err", err)
			return providerError(err)
		}
		rec.providerRefundID, rec.ledgerTxn = &pr.ID, uuid.NullUUID{UUID: txn, Valid: true}
		ref, out, err = s.recordRefund(ctx, tx, p, rec)
		return err
	})
	return ref, out, err
}

func (s *Service) checkRefund(p Payment, in RefundRequestInput) error {
	st := Status(p.Status)
	if !st.Captured() || p.CapturedAt == nil {
		return conflict("payment_not_refundable", "only a captured payment can be refunded").With("status", p.Status)
	}
	age := s.Clock.Now().Sub(*p.CapturedAt)
	if age > s.Config.RefundWindow {
		return apierr.New(apierr.RefundWindowExceeded, "the refund window of this payment has passed").
			With("captured_at", p.CapturedAt.UTC()).With("refund_window_seconds", int64(s.Config.RefundWindow.Seconds()))
	}
	if in.Currency != p.Currency {
		return apierr.Validation("amount.currency", "a refund is in the payment's currency %s", p.Currency).
			With("reason", "currency_mismatch")
	}
	remaining := p.CapturedMinor - p.RefundedMinor
	if in.AmountMinor > remaining {
		return conflict("refund_exceeds_captured", "the refund is more than the payment's captured amount minus what was already refunded").
			With("refundable_minor", remaining).With("currency", p.Currency)
	}
	return nil
}

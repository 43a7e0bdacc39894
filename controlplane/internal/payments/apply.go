package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/paymentsdb"
)

// result is what applying an event did: the payment it concerned, and why nothing
// changed when it was ignored.
type result struct {
	paymentID uuid.UUID
	ignored   string
}

// auditActions names the audit action of each status an event moves a payment to.
var auditActions = map[Status]string{
	StatusPending:   "payment.mark_pending",
	StatusSucceeded: "payment.capture",
	StatusFailed:    "payment.fail",
	StatusCanceled:  "payment.cancel",
}

// apply applies ev to its payment inside tx, forward-only: a move the transition table
// does not allow (a late or out-of-order event) is ignored, never applied. The payment
// row is locked, so events of one payment apply one at a time.
func (s *Service) apply(ctx context.Context, tx pgx.Tx, provider string, ev Event) (result, error) {
	if ev.Kind == KindIgnored {
		return result{ignored: "event_type_not_handled"}, nil
	}
	q := paymentsdb.New(tx)
	p, err := q.LockPaymentByProviderID(ctx, paymentsdb.LockPaymentByProviderIDParams{Provider: provider, ProviderPaymentID: &ev.ObjectID})
	if errors.Is(err, pgx.ErrNoRows) {
		if ev.PaymentID == uuid.Nil {
			// Another system's object on the same provider account.
			return result{ignored: "not_a_gantry_payment"}, nil
		}
		// Ours by its metadata, but not bound yet (the creating transaction may still be
		// open): fail, so a redelivery or Reconcile applies it later.
		return result{}, fmt.Errorf("payment %s of provider object %s not found", ev.PaymentID, ev.ObjectID)
	}
	if err != nil {
		return result{}, fmt.Errorf("lock payment: %w", err)
	}
	if ev.PaymentID != uuid.Nil && ev.PaymentID != p.ID {
		return result{}, fmt.Errorf("provider object %s names payment %s but is bound to %s", ev.ObjectID, ev.PaymentID, p.ID)
	}
	if ev.Currency != p.Currency {
		return result{}, fmt.Errorf("event currency %s differs from payment %s currency %s", ev.Currency, p.ID, p.Currency)
	}
	if ev.Kind == KindRefunded {
		return s.applyRefunded(ctx, tx, p, ev)
	}
	return s.applyStatus(ctx, tx, p, ev)
}

func (s *Service) applyStatus(ctx context.Context, tx pgx.Tx, p Payment, ev Event) (result, error) {
	from, to := Status(p.Status), ev.Kind.target()
	if !CanMove(from, to) {
		return result{paymentID: p.ID, ignored: fmt.Sprintf("no_transition_%s_to_%s", from, to)}, nil
	}
	now := s.Clock.Now()
	upd := paymentsdb.UpdatePaymentStateParams{
		ID: p.ID, Status: string(to), CapturedMinor: p.CapturedMinor, CapturedAt: p.CapturedAt,
		FailureCode: p.FailureCode, LedgerTxnID: p.LedgerTxnID, RefundedMinor: p.RefundedMinor, UpdatedAt: now,
	}
	switch to {
	case StatusSucceeded:
		if ev.CapturedMinor <= 0 || ev.CapturedMinor > p.AmountMinor {
			return result{}, fmt.Errorf("payment %s captured %d of %d", p.ID, ev.CapturedMinor, p.AmountMinor)
		}
		txn, err := s.Wallet.CreditTopUp(ctx, tx, p.TenantID, p.Currency, ev.CapturedMinor, p.ID)
		if err != nil {
			return result{}, fmt.Errorf("credit wallet: %w", err)
		}
		upd.CapturedMinor, upd.CapturedAt, upd.LedgerTxnID, upd.FailureCode = ev.CapturedMinor, &now, nullID(txn), nil
	case StatusFailed:
		code := ev.FailureCode
		if code == "" {
			code = "payment_failed"
		}
		upd.FailureCode = &code
	}
	np, err := paymentsdb.New(tx).UpdatePaymentState(ctx, upd)
	if err != nil {
		return result{}, fmt.Errorf("update payment: %w", err)
	}
	if err := s.event(ctx, tx, "payment."+string(to), np); err != nil {
		return result{}, err
	}
	if err := s.Audit.Record(ctx, tx, audit.Entry{
		Action: auditActions[to], TargetType: "payment", TargetID: p.ID.String(), TenantID: p.TenantID,
		ActorType: audit.ActorSystem,
		Metadata: map[string]any{
			"from": string(from), "to": string(to), "provider_event_id": ev.ID, "event_type": ev.Type,
			"captured_minor": np.CapturedMinor, "currency": p.Currency,
		},
	}); err != nil {
		return result{}, err
	}
	return result{paymentID: p.ID}, nil
}

// applyRefunded records what the provider refunded beyond what we know of (a refund
// made in the provider's dashboard, or one whose recording transaction was lost). The
// provider reports the cumulative amount, so an older event never undoes a newer one.
func (s *Service) applyRefunded(ctx context.Context, tx pgx.Tx, p Payment, ev Event) (result, error) {
	from := Status(p.Status)
	switch {
	case from == StatusCanceled:
		return result{paymentID: p.ID, ignored: "payment_canceled"}, nil
	case !from.Captured():
		// The capture event has not been applied yet: retry after it.
		return result{}, fmt.Errorf("refund event for payment %s in state %s", p.ID, from)
	case ev.RefundedMinor <= p.RefundedMinor:
		return result{paymentID: p.ID, ignored: "refund_already_recorded"}, nil
	case ev.RefundedMinor > p.CapturedMinor:
		return result{}, fmt.Errorf("provider refunded %d of payment %s, more than captured %d", ev.RefundedMinor, p.ID, p.CapturedMinor)
	}
	var providerRefundID *string
	if ev.RefundID != "" {
		_, err := paymentsdb.New(tx).RefundByProviderID(ctx, &ev.RefundID)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			providerRefundID = &ev.RefundID
		case err != nil:
			return result{}, fmt.Errorf("find refund: %w", err)
		}
	}
	_, _, err := s.recordRefund(ctx, tx, p, refundRecord{
		id: s.IDs.New(), amount: ev.RefundedMinor - p.RefundedMinor, origin: "provider",
		providerRefundID: providerRefundID, providerEventID: ev.ID,
	})
	if err != nil {
		return result{}, err
	}
	return result{paymentID: p.ID}, nil
}

type refundRecord struct {
	id               uuid.UUID
	amount           int64
	origin           string
	providerRefundID *string
	providerEventID  string
	reason           *string
	requestedBy      uuid.UUID
	// ledgerTxn is set when the caller has already debited the wallet.
	ledgerTxn uuid.NullUUID
}

// recordRefund debits the wallet (unless the caller did), stores the refund and moves
// the payment, with its event and audit row, inside tx. The caller holds the payment row
// lock and has checked that amount fits in captured minus refunded.
func (s *Service) recordRefund(ctx context.Context, tx pgx.Tx, p Payment, r refundRecord) (Refund, Payment, error) {
	if !r.ledgerTxn.Valid {
		txn, err := s.Wallet.DebitRefund(ctx, tx, p.TenantID, p.Currency, r.amount, r.id)
		if err != nil {
			return Refund{}, Payment{}, fmt.Errorf("debit wallet: %w", err)
		}
		r.ledgerTxn = nullID(txn)
	}
	q := paymentsdb.New(tx)
	now := s.Clock.Now()
	ref, err := q.InsertRefund(ctx, paymentsdb.InsertRefundParams{
		ID: r.id, PaymentID: p.ID, TenantID: p.TenantID, Currency: p.Currency, AmountMinor: r.amount,
		Origin: r.origin, Status: "succeeded", ProviderRefundID: r.providerRefundID, Reason: r.reason,
		RequestedBy: nullID(r.requestedBy), LedgerTxnID: r.ledgerTxn, CreatedAt: now,
	})
	if err != nil {
		return Refund{}, Payment{}, fmt.Errorf("insert refund: %w", err)
	}
	refunded := p.RefundedMinor + r.amount
	to := refundStatus(p.CapturedMinor, refunded)
	np, err := q.UpdatePaymentState(ctx, paymentsdb.UpdatePaymentStateParams{
		ID: p.ID, Status: string(to), CapturedMinor: p.CapturedMinor, CapturedAt: p.CapturedAt,
		FailureCode: p.FailureCode, LedgerTxnID: p.LedgerTxnID, RefundedMinor: refunded, UpdatedAt: now,
	})
	if err != nil {
		return Refund{}, Payment{}, fmt.Errorf("update payment: %w", err)
	}
	if err := s.event(ctx, tx, "payment.refunded", np, "refund_id", r.id.String(), "refund_amount_minor", r.amount); err != nil {
		return Refund{}, Payment{}, err
	}
	meta := map[string]any{
		"refund_id": r.id.String(), "amount_minor": r.amount, "currency": p.Currency, "origin": r.origin,
		"from": p.Status, "to": string(to),
	}
	if r.providerEventID != "" {
		meta["provider_event_id"] = r.providerEventID
	}
	if r.reason != nil {
		meta["reason"] = *r.reason
	}
	entry := audit.Entry{
		Action: "payment.refund", TargetType: "payment", TargetID: p.ID.String(), TenantID: p.TenantID, Metadata: meta,
	}
	if r.origin == "provider" {
		entry.ActorType = audit.ActorSystem
	}
	if err := s.Audit.Record(ctx, tx, entry); err != nil {
		return Refund{}, Payment{}, err
	}
	return ref, np, nil
}

package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/paymentsdb"
)

// reconcileHorizon: a payment created longer ago than this is not read back any more
// (an abandoned checkout).
const reconcileHorizon = 7 * 24 * time.Hour

// ReconcileReport says what one Reconcile pass did.
type ReconcileReport struct {
	EventsRetried   int
	PaymentsChecked int
	Failed          int
}

// Reconcile repairs what webhooks alone can miss, and is safe to run on every replica
// at any time (everything it does goes through the same locks and state machine as a
// webhook):
//
//   - stored events that failed to apply (or whose request died before applying them)
//     are applied again, up to maxEventAttempts;
//   - payments still created/pending ReconcileAfter after their last change are read
//     back from the provider, and the provider's state is applied as if an event had
//     said it (a missed payment_intent.succeeded still credits the wallet, once).
//
// Each failure counts in payments_reconcile_failed_total.
func (s *Service) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	now := s.Clock.Now()
	q := paymentsdb.New(s.Pool)
	// Events younger than a minute may still be in their first delivery's hands.
	ids, err := q.ListUnprocessedEvents(ctx, paymentsdb.ListUnprocessedEventsParams{
		ReceivedAt: now.Add(-time.Minute), Attempts: maxEventAttempts, Limit: reconcileBatch,
	})
	if err != nil {
		s.Metrics.ReconcileFailed.Inc()
		return rep, fmt.Errorf("list unprocessed events: %w", err)
	}
	for _, id := range ids {
		row, err := q.WebhookEventByID(ctx, id)
		if err != nil {
			rep.Failed++
			s.Metrics.ReconcileFailed.Inc()
			continue
		}
		prov, ok := s.provider(row.Provider)
		if !ok {
			continue
		}
		obj := ""
		if row.ObjectID != nil {
			obj = *row.ObjectID
		}
		rep.EventsRetried++
		if err := s.processStored(ctx, prov, id, obj); err != nil {
			rep.Failed++
			s.Metrics.ReconcileFailed.Inc()
		}
	}

	stale, err := q.ListStalePayments(ctx, paymentsdb.ListStalePaymentsParams{
		QuietSince: now.Add(-s.Config.ReconcileAfter), CreatedAfter: now.Add(-reconcileHorizon), Batch: reconcileBatch,
	})
	if err != nil {
		s.Metrics.ReconcileFailed.Inc()
		return rep, fmt.Errorf("list stale payments: %w", err)
	}
	for _, p := range stale {
		rep.PaymentsChecked++
		if err := s.reconcilePayment(ctx, p); err != nil {
			rep.Failed++
			s.Metrics.ReconcileFailed.Inc()
			s.Log.WarnContext(ctx, "payment reconciliation failed", "payment_id", p.ID, "err", err)
		}
	}
	return rep, nil
}

// reconcilePayment reads a payment back from its provider and applies the provider's
// state through the state machine.
func (s *Service) reconcilePayment(ctx context.Context, p Payment) error {
	prov, ok := s.provider(p.Provider)
	if !ok || p.ProviderPaymentID == nil {
		return fmt.Errorf("payment %s has no provider object", p.ID)
	}
	pp, err := prov.GetPayment(ctx, *p.ProviderPaymentID)
	if err != nil {
		return err
	}
	ev := Event{
		ID: "reconcile", Type: "reconcile", ObjectID: pp.ID, PaymentID: p.ID, Currency: pp.Currency,
		CapturedMinor: pp.CapturedMinor, FailureCode: pp.FailureCode,
	}
	switch pp.Status {
	case StatusPending:
		ev.Kind = KindPending
	case StatusSucceeded:
		ev.Kind = KindSucceeded
	case StatusCanceled:
		ev.Kind = KindCanceled
	default:
		return nil // still waiting for the customer
	}
	defer s.paymentLocks.lock(prov.Name() + ":" + pp.ID)()
	wctx, cancel := context.WithTimeout(ctx, workTimeout)
	defer cancel()
	return db.InTx(wctx, s.Pool, func(tx pgx.Tx) error {
		_, err := s.apply(wctx, tx, prov.Name(), ev)
		return err
	})
}

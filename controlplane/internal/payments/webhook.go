package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/paymentsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Webhook event row states.
const (
	eventReceived  = "received"
	eventProcessed = "processed"
	eventIgnored   = "ignored"
	eventFailed    = "failed"
)

// Ack is the answer to a webhook delivery.
type Ack struct {
	EventID   string
	Duplicate bool
}

func signatureInvalid(reason string) *apierr.Error {
	return apierr.New(apierr.PaymentSignatureInvalid, "the webhook signature could not be verified").With("reason", reason)
}

// ReceiveWebhook authenticates, stores and applies one provider webhook delivery.
//
// Order matters: the body is read under the cap and its signature checked before
// anything is parsed or written, so a forged or oversized request touches nothing but
// the counters. A verified event is stored once per provider event id (a duplicate,
// even a concurrent one, finds the stored row) and then applied in its own transaction
// with the event row locked, so an event is applied at most once. A processing failure
// leaves the stored event for the next delivery or Reconcile.
func (s *Service) ReceiveWebhook(ctx context.Context, providerName, signature string, body io.Reader) (Ack, error) {
	s.Metrics.Received.Inc()
	raw, err := io.ReadAll(io.LimitReader(body, s.Config.WebhookMaxBody+1))
	if err != nil {
		s.Metrics.SignatureFailures.Inc()
		return Ack{}, signatureInvalid("body_unreadable").Wrap(err)
	}
	if int64(len(raw)) > s.Config.WebhookMaxBody {
		s.Metrics.SignatureFailures.Inc()
		return Ack{}, signatureInvalid("body_too_large").With("max_bytes", s.Config.WebhookMaxBody)
	}
	prov, ok := s.provider(providerName)
	if !ok {
		s.Metrics.SignatureFailures.Inc()
		return Ack{}, signatureInvalid("unknown_provider")
	}
	if err := prov.VerifyWebhook(signature, raw, s.Clock.Now()); err != nil {
		s.Metrics.SignatureFailures.Inc()
		s.Log.WarnContext(ctx, "payment webhook signature refused", "provider", providerName, "reason", err.Error())
		return Ack{}, signatureInvalid(err.Error())
	}
	ev, err := prov.ParseEvent(raw)
	if err != nil || !json.Valid(raw) {
		s.Metrics.InvalidPayload.Inc()
		return Ack{}, apierr.New(apierr.InvalidRequest, "the webhook body is not a %s event", providerName).
			With("reason", "invalid_payload").Wrap(err)
	}

	row, dup, err := s.store(ctx, prov.Name(), ev, raw)
	if err != nil {
		s.Metrics.PersistFailures.Inc()
		s.Log.ErrorContext(ctx, "payment webhook event not stored", "provider", providerName, "event_id", ev.ID, "err", err)
		return Ack{}, apierr.Internal(err)
	}
	ack := Ack{EventID: ev.ID, Duplicate: dup}
	if row.Status == eventProcessed || row.Status == eventIgnored {
		return ack, nil
	}
	if err := s.processStored(ctx, prov, row.ID, ev.ObjectID); err != nil {
		return Ack{}, apierr.Internal(err)
	}
	return ack, nil
}

// store inserts the event, or finds it when the provider event id is already stored.
func (s *Service) store(ctx context.Context, provider string, ev Event, raw []byte) (paymentsdb.PaymentWebhookEvent, bool, error) {
	var created *time.Time
	if !ev.Created.IsZero() {
		created = ptr(ev.Created)
	}
	var obj *string
	if ev.ObjectID != "" {
		obj = &ev.ObjectID
	}
	q := paymentsdb.New(s.Pool)
	row, err := q.InsertWebhookEvent(ctx, paymentsdb.InsertWebhookEventParams{
		ID: s.IDs.New(), Provider: provider, ProviderEventID: ev.ID, EventType: ev.Type, ObjectID: obj,
		Payload: raw, ProviderCreated: created, ReceivedAt: s.Clock.Now(),
	})
	if err == nil {
		return row, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return row, false, fmt.Errorf("insert webhook event: %w", err)
	}
	row, err = q.GetWebhookEvent(ctx, paymentsdb.GetWebhookEventParams{Provider: provider, ProviderEventID: ev.ID})
	if err != nil {
		return row, true, fmt.Errorf("read stored webhook event: %w", err)
	}
	return row, true, nil
}

// processStored applies the stored event id once: the event row is locked for the
// transaction, and an event already processed (by a concurrent delivery) is left alone.
// objectID (the provider payment object, "" when none) keys the in-process lock.
func (s *Service) processStored(ctx context.Context, prov Provider, eventRowID uuid.UUID, objectID string) error {
	key := prov.Name() + ":" + objectID
	if objectID == "" {
		key = "event:" + eventRowID.String()
	}
	defer s.paymentLocks.lock(key)()
	wctx, cancel := context.WithTimeout(ctx, workTimeout)
	defer cancel()
	var applied bool
	err := db.InTx(wctx, s.Pool, func(tx pgx.Tx) error {
		ctx := wctx
		q := paymentsdb.New(tx)
		row, err := q.LockWebhookEvent(ctx, eventRowID)
		if err != nil {
			return fmt.Errorf("lock webhook event: %w", err)
		}
		if row.Status == eventProcessed || row.Status == eventIgnored {
			return nil
		}
		ev, err := prov.ParseEvent(row.Payload)
		if err != nil {
			return fmt.Errorf("stored event no longer parses: %w", err)
		}
		res, err := s.apply(ctx, tx, prov.Name(), ev)
		if err != nil {
			return err
		}
		status := eventProcessed
		var note *string
		if res.ignored != "" {
			status, note = eventIgnored, &res.ignored
		}
		now := s.Clock.Now()
		applied = true
		return q.FinishWebhookEvent(ctx, paymentsdb.FinishWebhookEventParams{
			ID: row.ID, Status: status, PaymentID: nullID(res.paymentID), LastError: note, ProcessedAt: &now,
		})
	})
	if err != nil {
		s.Metrics.ProcessingFailures.Inc()
		s.Log.ErrorContext(ctx, "payment webhook event not applied", "event_row_id", eventRowID, "err", err)
		msg := truncate(err.Error(), 500)
		if ferr := paymentsdb.New(s.Pool).FailWebhookEvent(context.WithoutCancel(ctx), paymentsdb.FailWebhookEventParams{ID: eventRowID, LastError: &msg}); ferr != nil {
			s.Log.ErrorContext(ctx, "payment webhook event failure not recorded", "event_row_id", eventRowID, "err", ferr)
		}
		return err
	}
	if applied {
		s.Metrics.ProcessedSuccess.Inc()
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

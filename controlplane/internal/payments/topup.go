package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/paymentsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// TopUp is a created top-up: the payment and the provider's client secret.
type TopUp struct {
	Payment      Payment
	ClientSecret string
}

// CreateTopUp starts a top-up of the tenant's wallet: it stores the payment, creates the
// provider's payment object (the provider call runs inside the transaction, so a refusal
// leaves nothing behind) and records the event and audit row. The wallet is credited
// only when the provider's webhook reports the payment captured.
func (s *Service) CreateTopUp(ctx context.Context, tenantID, userID uuid.UUID, currency string, amountMinor int64) (TopUp, error) {
	if err := s.validateAmount("amount", currency, amountMinor); err != nil {
		return TopUp{}, err
	}
	if !acceptsCurrency(s.Config.Currencies, currency) {
		return TopUp{}, apierr.Validation("amount.currency", "top-ups in %s are not accepted", currency).
			With("reason", "currency_not_supported").With("supported_currencies", s.Config.Currencies)
	}
	prov, _ := s.provider(ProviderStripe)
	var out TopUp
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := paymentsdb.New(tx)
		now := s.Clock.Now()
		p, err := q.InsertPayment(ctx, paymentsdb.InsertPaymentParams{
			ID: s.IDs.New(), TenantID: tenantID, CreatedBy: nullID(userID), Provider: prov.Name(),
			Currency: currency, AmountMinor: amountMinor, CreatedAt: now,
		})
		if err != nil {
			return fmt.Errorf("insert payment: %w", err)
		}
		pp, err := prov.CreatePayment(ctx, PaymentRequest{PaymentID: p.ID, TenantID: tenantID, Currency: currency, AmountMinor: amountMinor})
		if err != nil {
			s.Log.WarnContext(ctx, "payment provider refused a top-up", "payment_id", p.ID, "err", err)
			return providerError(err)
		}
		if p, err = q.SetProviderPaymentID(ctx, paymentsdb.SetProviderPaymentIDParams{ID: p.ID, ProviderPaymentID: &pp.ID, UpdatedAt: now}); err != nil {
			if db.IsUniqueViolation(err, "payments_provider_payment_key") {
				return apierr.Internal(errors.New("provider returned a payment object already bound to another payment"))
			}
			return fmt.Errorf("bind provider payment: %w", err)
		}
		if err := s.event(ctx, tx, "payment.created", p); err != nil {
			return err
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "payment.create", TargetType: "payment", TargetID: p.ID.String(), TenantID: tenantID,
			Metadata: map[string]any{"currency": currency, "amount_minor": amountMinor, "provider": prov.Name()},
		}); err != nil {
			return err
		}
		out = TopUp{Payment: p, ClientSecret: pp.ClientSecret}
		return nil
	})
	return out, err
}

// event enqueues a payment.* domain event: identifiers and amounts only.
func (s *Service) event(ctx context.Context, tx pgx.Tx, typ string, p Payment, extra ...any) error {
	payload := map[string]any{
		"payment_id": p.ID.String(), "tenant_id": p.TenantID.String(), "status": p.Status,
		"currency": p.Currency, "amount_minor": p.AmountMinor, "captured_minor": p.CapturedMinor,
		"refunded_minor": p.RefundedMinor,
	}
	for i := 0; i+1 < len(extra); i += 2 {
		payload[extra[i].(string)] = extra[i+1]
	}
	_, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: outbox.SubjectPrefix + typ, Payload: payload})
	return err
}

// Page is one page of payments; More says whether payments follow.
type Page struct {
	Items []Payment
	More  bool
}

// ListTenant is a page of the tenant's payments, newest first, after the cursor id.
func (s *Service) ListTenant(ctx context.Context, tenantID, after uuid.UUID, limit int) (Page, error) {
	rows, err := s.read(ctx).ListTenantPayments(ctx, paymentsdb.ListTenantPaymentsParams{
		TenantID: tenantID, After: nullID(after), Limit: int32(limit + 1),
	})
	if err != nil {
		return Page{}, fmt.Errorf("list payments: %w", err)
	}
	return page(rows, limit), nil
}

// ListAll is a page of every tenant's payments (admin), optionally filtered.
func (s *Service) ListAll(ctx context.Context, tenantID uuid.UUID, status *string, after uuid.UUID, limit int) (Page, error) {
	rows, err := s.read(ctx).ListPayments(ctx, paymentsdb.ListPaymentsParams{
		TenantID: nullID(tenantID), Status: status, After: nullID(after), Limit: int32(limit + 1),
	})
	if err != nil {
		return Page{}, fmt.Errorf("list payments: %w", err)
	}
	return page(rows, limit), nil
}

func page(rows []Payment, limit int) Page {
	if rows == nil {
		rows = []Payment{}
	}
	if len(rows) > limit {
		return Page{Items: rows[:limit], More: true}
	}
	return Page{Items: rows}
}

// Get is one payment.
func (s *Service) Get(ctx context.Context, id uuid.UUID) (Payment, error) {
	p, err := s.read(ctx).GetPayment(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, notFound("payment")
	}
	return p, err
}

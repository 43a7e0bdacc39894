package payments

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Provider is a payment provider: it creates the provider-side payment object of a
// top-up, reads it back (reconciliation), refunds it, and authenticates and parses its
// webhook events. Stripe is the one implementation; a provider's name is the {provider}
// of the webhook path.
type Provider interface {
	Name() string
	// CreatePayment creates the provider's payment object for a top-up. The request's
	// PaymentID is the provider-side idempotency key, so a retried call creates one object.
	CreatePayment(ctx context.Context, req PaymentRequest) (ProviderPayment, error)
	// GetPayment reads the provider's payment object.
	GetPayment(ctx context.Context, providerPaymentID string) (ProviderPayment, error)
	// Refund refunds amount of a captured payment; RefundID is the idempotency key.
	Refund(ctx context.Context, req RefundRequest) (ProviderRefund, error)
	// VerifyWebhook authenticates a webhook body by its signature header at now.
	VerifyWebhook(signature string, body []byte, now time.Time) error
	// ParseEvent turns a verified webhook body into an Event; an error means the body is
	// not an event of this provider.
	ParseEvent(body []byte) (Event, error)
}

// PaymentRequest asks the provider for a payment object.
type PaymentRequest struct {
	PaymentID   uuid.UUID
	TenantID    uuid.UUID
	Currency    string
	AmountMinor int64
}

// ProviderPayment is the provider's view of a payment.
type ProviderPayment struct {
	ID            string
	ClientSecret  string // only on creation
	Status        Status // mapped to ours; "" when the provider's state maps to none
	Currency      string
	AmountMinor   int64
	CapturedMinor int64
	FailureCode   string
}

// RefundRequest asks the provider to refund part of a payment.
type RefundRequest struct {
	RefundID          uuid.UUID
	PaymentID         uuid.UUID
	ProviderPaymentID string
	Currency          string
	AmountMinor       int64
}

// ProviderRefund is the provider's refund object.
type ProviderRefund struct {
	ID     string
	Status string
}

// EventKind is what an event means for a payment.
type EventKind int

const (
	// KindIgnored: an event type payments does not act on (stored, marked ignored).
	KindIgnored EventKind = iota
	KindPending
	KindSucceeded
	KindFailed
	KindCanceled
	// KindRefunded carries the provider's cumulative refunded amount.
	KindRefunded
)

// target is the status an event kind asks for.
func (k EventKind) target() Status {
	switch k {
	case KindPending:
		return StatusPending
	case KindSucceeded:
		return StatusSucceeded
	case KindFailed:
		return StatusFailed
	case KindCanceled:
		return StatusCanceled
	}
	return ""
}

// Event is a provider webhook event, normalised.
type Event struct {
	ID      string
	Type    string
	Created time.Time
	Kind    EventKind
	// ObjectID is the provider payment object the event is about (for a charge event,
	// the charge's payment object).
	ObjectID string
	// PaymentID is our payment id from the object's metadata; uuid.Nil when absent
	// (an object some other system created on the same provider account).
	PaymentID uuid.UUID
	Currency  string
	// CapturedMinor is the amount received (KindSucceeded); RefundedMinor the
	// cumulative amount refunded (KindRefunded).
	CapturedMinor int64
	RefundedMinor int64
	// RefundID is the provider's latest refund id (KindRefunded), when given.
	RefundID    string
	FailureCode string
}

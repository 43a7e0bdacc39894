package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/paymentsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Wallet is the billing ledger as payments sees it (*billing.Ledger satisfies it). Both
// calls post inside the caller's transaction, so a credit commits exactly with the
// payment's state change, and both are idempotent per payment / refund id.
type Wallet interface {
	CreditTopUp(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string, amountMinor int64, paymentID uuid.UUID) (ledgerTxnID uuid.UUID, err error)
	DebitRefund(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string, amountMinor int64, refundID uuid.UUID) (ledgerTxnID uuid.UUID, err error)
}

// Limits of the contract and of this package.
const (
	// MaxAmountMinor bounds one top-up or refund (1,000,000.00 in a two-decimal currency).
	MaxAmountMinor = 100_000_000
	// DefaultRefundWindow is how long after capture a payment may be refunded.
	DefaultRefundWindow = 180 * 24 * time.Hour
	// DefaultWebhookMaxBody caps a webhook body; a larger one is refused unverified.
	DefaultWebhookMaxBody = 256 << 10
	// DefaultReconcileAfter: a payment still created/pending this long after its last
	// change is read back from the provider by Reconcile.
	DefaultReconcileAfter = 15 * time.Minute
	// maxEventAttempts: Reconcile stops retrying an event after this many failures.
	maxEventAttempts = 20
	// reconcileBatch bounds one Reconcile pass.
	reconcileBatch = 100
	// workTimeout bounds one transaction that applies an event or a refund (provider call
	// included): a stuck one fails and is retried rather than holding its locks forever.
	workTimeout = 30 * time.Second
)

// DefaultCurrencies are accepted for top-ups when Config.Currencies is empty.
var DefaultCurrencies = []string{"USD", "EUR", "GBP", "JPY"}

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

// Config configures payments (GANTRY_PAYMENTS_* in app.Config).
type Config struct {
	// ProviderBaseURL is the provider API (https://api.stripe.com); ProviderAPIKey its
	// secret key. Without a key top-ups answer service_unavailable.
	ProviderBaseURL string
	ProviderAPIKey  string
	// WebhookSecrets are the webhook signing secrets; any verifies (rotation).
	WebhookSecrets []string
	// RefundWindow: a refund more than this long after capture is refund_window_exceeded.
	RefundWindow time.Duration
	// WebhookMaxBody caps a webhook body (bytes).
	WebhookMaxBody int64
	// Currencies a top-up may be made in.
	Currencies []string
	// ReconcileAfter: see DefaultReconcileAfter.
	ReconcileAfter time.Duration
	// HTTPClient talks to the provider (tests may inject one); nil: 15 s timeout.
	HTTPClient *http.Client
}

func (c Config) withDefaults() Config {
	if c.RefundWindow <= 0 {
		c.RefundWindow = DefaultRefundWindow
	}
	if c.WebhookMaxBody <= 0 {
		c.WebhookMaxBody = DefaultWebhookMaxBody
	}
	if len(c.Currencies) == 0 {
		c.Currencies = DefaultCurrencies
	}
	if c.ReconcileAfter <= 0 {
		c.ReconcileAfter = DefaultReconcileAfter
	}
	return c
}

// Metrics are the webhook worker counters of seed §6.3, names exactly the contract's.
type Metrics struct {
	Received           prometheus.Counter
	SignatureFailures  prometheus.Counter
	InvalidPayload     prometheus.Counter
	PersistFailures    prometheus.Counter
	ProcessedSuccess   prometheus.Counter
	ProcessingFailures prometheus.Counter
	ReconcileFailed    prometheus.Counter
}

// NewMetrics creates the counters and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &Metrics{
		Received:           c("webhook_events_received_total", "Payment provider webhook requests received."),
		SignatureFailures:  c("webhook_signature_failures_total", "Webhook requests refused: signature missing, wrong, stale, or body over the cap."),
		InvalidPayload:     c("webhook_invalid_payload_total", "Correctly signed webhook bodies that are not a readable provider event."),
		PersistFailures:    c("webhook_persist_failures_total", "Verified webhook events that could not be stored."),
		ProcessedSuccess:   c("webhook_processed_success_total", "Webhook events applied (or deliberately ignored) successfully."),
		ProcessingFailures: c("webhook_processing_failures_total", "Stored webhook events whose processing failed (retried by reconciliation)."),
		ReconcileFailed:    c("payments_reconcile_failed_total", "Reconciliation attempts (event retries, provider read-backs) that failed."),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.Received, m.SignatureFailures, m.InvalidPayload,
			m.PersistFailures, m.ProcessedSuccess, m.ProcessingFailures, m.ReconcileFailed} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("payments metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Service is payments: top-ups, webhook events, refunds and reconciliation.
type Service struct {
	Pool      *pgxpool.Pool
	Clock     clock.Clock
	IDs       ids.Source
	Config    Config
	Wallet    Wallet
	Providers map[string]Provider
	Metrics   *Metrics
	Outbox    *outbox.Writer
	Audit     *audit.Log
	Log       *slog.Logger

	// paymentLocks serialises, per provider payment object, the work that locks its row.
	paymentLocks keyLock
}

// New assembles payments with the Stripe provider built from cfg, registering the
// metrics on reg.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cfg Config, wallet Wallet, reg prometheus.Registerer, log *slog.Logger) (*Service, error) {
	cfg = cfg.withDefaults()
	for _, c := range cfg.Currencies {
		if !currencyPattern.MatchString(c) {
			return nil, fmt.Errorf("payments: currency %q is not three uppercase letters", c)
		}
	}
	m, err := NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var secrets [][]byte
	for _, s := range cfg.WebhookSecrets {
		if s = strings.TrimSpace(s); s != "" {
			secrets = append(secrets, []byte(s))
		}
	}
	stripe := &Stripe{BaseURL: cfg.ProviderBaseURL, APIKey: cfg.ProviderAPIKey, Secrets: secrets, HTTP: cfg.HTTPClient}
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc, Config: cfg, Wallet: wallet,
		Providers: map[string]Provider{stripe.Name(): stripe},
		Metrics:   m,
		Outbox:    &outbox.Writer{Clock: clk, IDs: idSrc},
		Audit:     &audit.Log{Clock: clk, IDs: idSrc},
		Log:       log,
	}, nil
}

// MustNew is New for program assembly.
func MustNew(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cfg Config, wallet Wallet, reg prometheus.Registerer, log *slog.Logger) *Service {
	s, err := New(pool, clk, idSrc, cfg, wallet, reg, log)
	if err != nil {
		panic(err)
	}
	return s
}

// Payment is a stored payment.
type Payment = paymentsdb.Payment

// Refund is a stored refund.
type Refund = paymentsdb.PaymentRefund

var errNotConfigured = errors.New("payment provider not configured")

func (s *Service) read(ctx context.Context) *paymentsdb.Queries {
	return paymentsdb.New(db.Querier(ctx, s.Pool))
}

// validateAmount applies the contract's Money rules and ours to an amount; field names
// the request field (amount).
func (s *Service) validateAmount(field, currency string, amountMinor int64) error {
	if !currencyPattern.MatchString(currency) {
		return apierr.Validation(field+".currency", "currency must be three uppercase letters").With("reason", "invalid_currency")
	}
	if amountMinor <= 0 {
		return apierr.Validation(field+".amount_minor", "amount must be positive").With("reason", "amount_not_positive")
	}
	if amountMinor > MaxAmountMinor {
		return apierr.Validation(field+".amount_minor", "amount must be at most %d minor units", MaxAmountMinor).
			With("reason", "amount_too_large").With("max_amount_minor", MaxAmountMinor)
	}
	return nil
}

func notFound(what string) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "%s not found", what).With("reason", "not_found").WithStatus(http.StatusNotFound)
}

func conflict(reason, format string, args ...any) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, format, args...).With("reason", reason).WithStatus(http.StatusConflict)
}

// providerError maps a provider failure to the client: never the provider's text.
func providerError(err error) error {
	if errors.Is(err, errNotConfigured) {
		return apierr.New(apierr.ServiceUnavailable, "payments are not configured on this deployment").Wrap(err)
	}
	e := apierr.New(apierr.UpstreamError, "the payment provider did not accept the request").Wrap(err)
	var pe *ProviderError
	if errors.As(err, &pe) && pe.Code != "" && len(pe.Code) <= 64 {
		e = e.With("provider_code", pe.Code)
	}
	return e
}

func (s *Service) provider(name string) (Provider, bool) {
	p, ok := s.Providers[name]
	return p, ok
}

func acceptsCurrency(list []string, c string) bool { return slices.Contains(list, c) }

func ptr[T any](v T) *T { return &v }

func nullID(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: id != uuid.Nil} }

package invoices

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Account is what an invoice needs to know about the billing account it is addressed
// to: who sells, who buys, the tax profile and the invoice settings.
type Account struct {
	ID               uuid.NullUUID // the billing account; invalid for an implicit tenant account
	TenantID         uuid.UUID
	SellerKey        string // numbering scope: "platform" or "reseller:<tenant id>"
	SellerName       string
	CustomerName     string
	PaymentTermsDays int
	Tax              TaxProfile
}

// Accounts resolves the account an invoice of tenantID is built for, inside the close's
// transaction. An account that may not be invoiced (deleted, or an end customer whose
// reseller is disabled) is refused by it with its contract error.
type Accounts interface {
	InvoiceAccount(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string) (Account, error)
}

// PlatformSeller is the seller key of invoices the platform issues.
const PlatformSeller = "platform"

// DefaultTerms is the payment term of accounts that set none.
const DefaultTerms = 30

// TenantAccounts is the implicit account of every tenant without a billing account: the
// platform sells, no tax configured, 30 days.
type TenantAccounts struct{ SellerName string }

// InvoiceAccount implements Accounts.
func (a TenantAccounts) InvoiceAccount(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, _ string) (Account, error) {
	var name string
	if err := tx.QueryRow(ctx, `SELECT name FROM tenants WHERE id = $1`, tenantID).Scan(&name); err != nil {
		if err == pgx.ErrNoRows {
			return Account{}, notFound("tenant")
		}
		return Account{}, fmt.Errorf("invoice account: %w", err)
	}
	seller := a.SellerName
	if seller == "" {
		seller = "Gantry"
	}
	return Account{
		TenantID: tenantID, SellerKey: PlatformSeller, SellerName: seller, CustomerName: name,
		PaymentTermsDays: DefaultTerms, Tax: TaxProfile{Treatment: TreatmentNotConfigured},
	}, nil
}

// Event types (subjects gantry.events.<type>); payload: invoice_id, tenant_id, number,
// status, currency, total_minor, amount_due_minor, period_start, period_end.
const (
	EventIssued = "invoice.issued"
	EventPaid   = "invoice.paid"
	EventVoided = "invoice.voided"
)

// Metrics are the invoice counters on /metrics.
type Metrics struct {
	Closed      prometheus.Counter
	Transitions *prometheus.CounterVec
}

// NewMetrics registers the invoice counters on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Closed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gantry_invoices_closed_total",
			Help: "Draft invoices built by period closes (a re-run that finds the invoice is not counted).",
		}),
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gantry_invoice_transitions_total",
			Help: "Invoice status changes by the status entered.",
		}, []string{"to"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.Closed, m.Transitions} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// Service is the invoices domain. Every mutation runs in one transaction with its audit
// row and outbox event.
type Service struct {
	Pool     *pgxpool.Pool
	Clock    clock.Clock
	IDs      ids.Source
	Audit    *audit.Log
	Outbox   *outbox.Writer
	Ledger   *billing.Ledger
	Accounts Accounts
	Metrics  *Metrics
}

// New assembles the service; accounts nil means TenantAccounts.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, ledger *billing.Ledger, accounts Accounts, reg prometheus.Registerer) (*Service, error) {
	if accounts == nil {
		accounts = TenantAccounts{}
	}
	m, err := NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc, Ledger: ledger, Accounts: accounts, Metrics: m,
		Audit:  &audit.Log{Clock: clk, IDs: idSrc},
		Outbox: &outbox.Writer{Clock: clk, IDs: idSrc},
	}, nil
}

// Invoice is one invoice with its figures.
type Invoice struct {
	ID                      uuid.UUID
	TenantID                uuid.UUID
	BillingAccountID        uuid.NullUUID
	SellerKey               string
	Currency                string
	PeriodStart, PeriodEnd  time.Time
	Status                  string
	Number                  *string
	Totals                  Totals
	Paid                    int64 // applied after issue
	TaxJurisdiction         *string
	TaxTreatment            string
	SellerTaxRegistration   *string
	CustomerTaxRegistration *string
	TaxSnapshot             map[string]any
	SellerName              string
	CustomerName            string
	LegalNote               *string
	PaymentTermsDays        int
	IssuedAt, DueAt         *time.Time
	FinalizedAt, PaidAt     *time.Time
	VoidedAt, WrittenOffAt  *time.Time
	CreatedAt, UpdatedAt    time.Time
	Lines                   []Line // only when asked for
}

// AmountDue is what is left to collect: total − prepaid − paid, never below zero.
func (inv Invoice) AmountDue() int64 {
	d := inv.Totals.Total - inv.Totals.Prepaid - inv.Paid
	if d < 0 {
		return 0
	}
	return d
}

// Line is one invoice line.
type Line struct {
	ID                  uuid.UUID
	Position            int
	Type                string
	Description         string
	Currency            string
	Amount              int64
	RatedUsageLineID    uuid.NullUUID
	LedgerEntryID       uuid.NullUUID
	PaymentSessionID    uuid.NullUUID
	TaxCategory         *string
	TaxRateBps          *int
	TaxJurisdiction     *string
	TaxSubjectLineID    uuid.NullUUID
	TaxExemptReason     *string
	ReverseChargeReason *string
	TaxEvidence         map[string]any
	CreatedAt           time.Time
}

func (s *Service) enqueue(ctx context.Context, tx pgx.Tx, typ string, inv Invoice) error {
	payload := map[string]any{
		"invoice_id": inv.ID, "tenant_id": inv.TenantID, "status": inv.Status, "currency": inv.Currency,
		"total_minor": inv.Totals.Total, "amount_due_minor": inv.AmountDue(),
		"period_start": inv.PeriodStart, "period_end": inv.PeriodEnd,
	}
	if inv.Number != nil {
		payload["number"] = *inv.Number
	}
	_, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload})
	return err
}

// notFound is the 404 of an invoice (the contract has no invoice_not_found code).
func notFound(what string) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "%s not found", what).With("reason", "not_found").WithStatus(404)
}

func conflict(reason, format string, args ...any) *apierr.Error {
	return apierr.New(apierr.InvalidRequest, format, args...).With("reason", reason).WithStatus(409)
}

func jsonOf(v any) []byte {
	if v == nil {
		return []byte("{}")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return []byte("{}")
	}
	return b
}

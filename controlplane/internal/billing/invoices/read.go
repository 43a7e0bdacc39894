package invoices

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
)

const invoiceColumns = `id, tenant_id, billing_account_id, seller_key, currency, period_start, period_end, status, number,
	subtotal_minor, tax_total_minor, credits_minor, total_minor, prepaid_minor, received_minor, paid_minor, tax_jurisdiction, tax_treatment,
	seller_tax_registration, customer_tax_registration, tax_snapshot, seller_name, customer_name, legal_note,
	payment_terms_days, issued_at, due_at, finalized_at, paid_at, voided_at, written_off_at, created_at, updated_at`

type scanner interface{ Scan(dest ...any) error }

func scanInvoice(r scanner) (Invoice, error) {
	var inv Invoice
	var snap []byte
	err := r.Scan(&inv.ID, &inv.TenantID, &inv.BillingAccountID, &inv.SellerKey, &inv.Currency, &inv.PeriodStart, &inv.PeriodEnd,
		&inv.Status, &inv.Number, &inv.Totals.Subtotal, &inv.Totals.Tax, &inv.Totals.Credits, &inv.Totals.Total, &inv.Totals.Prepaid,
		&inv.Totals.Received, &inv.Paid, &inv.TaxJurisdiction, &inv.TaxTreatment, &inv.SellerTaxRegistration, &inv.CustomerTaxRegistration, &snap,
		&inv.SellerName, &inv.CustomerName, &inv.LegalNote, &inv.PaymentTermsDays, &inv.IssuedAt, &inv.DueAt, &inv.FinalizedAt,
		&inv.PaidAt, &inv.VoidedAt, &inv.WrittenOffAt, &inv.CreatedAt, &inv.UpdatedAt)
	if err != nil {
		return Invoice{}, err
	}
	inv.TaxSnapshot = map[string]any{}
	if len(snap) > 0 {
		if err := json.Unmarshal(snap, &inv.TaxSnapshot); err != nil {
			return Invoice{}, fmt.Errorf("invoice tax snapshot: %w", err)
		}
	}
	return inv, nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// load reads one invoice (optionally with its lines); lock takes the row lock (tx only).
func (s *Service) load(ctx context.Context, q querier, id uuid.UUID, lock bool) (Invoice, error) {
	sql := `SELECT ` + invoiceColumns + ` FROM billing_invoices WHERE id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	inv, err := scanInvoice(q.QueryRow(ctx, sql, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Invoice{}, notFound("invoice")
	}
	if err != nil {
		return Invoice{}, fmt.Errorf("load invoice: %w", err)
	}
	return inv, nil
}

func (s *Service) lines(ctx context.Context, q querier, invoiceID uuid.UUID) ([]Line, error) {
	rows, err := q.Query(ctx, `SELECT id, position, line_type, description, currency, amount_minor, rated_usage_line_id,
			ledger_entry_id, payment_session_id, tax_category, tax_rate_bps, tax_jurisdiction, tax_subject_line_id,
			tax_exempt_reason, reverse_charge_reason, tax_evidence, created_at
		FROM billing_invoice_lines WHERE invoice_id = $1 ORDER BY position`, invoiceID)
	if err != nil {
		return nil, fmt.Errorf("invoice lines: %w", err)
	}
	defer rows.Close()
	var out []Line
	for rows.Next() {
		var l Line
		var ev []byte
		var rate *int32
		if err := rows.Scan(&l.ID, &l.Position, &l.Type, &l.Description, &l.Currency, &l.Amount, &l.RatedUsageLineID,
			&l.LedgerEntryID, &l.PaymentSessionID, &l.TaxCategory, &rate, &l.TaxJurisdiction, &l.TaxSubjectLineID,
			&l.TaxExemptReason, &l.ReverseChargeReason, &ev, &l.CreatedAt); err != nil {
			return nil, err
		}
		if rate != nil {
			r := int(*rate)
			l.TaxRateBps = &r
		}
		l.TaxEvidence = map[string]any{}
		if len(ev) > 0 {
			if err := json.Unmarshal(ev, &l.TaxEvidence); err != nil {
				return nil, err
			}
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// Get is one invoice with its lines. tenantID restricts it to that tenant's non-draft
// invoices (uuid.Nil: any, for platform admins); anything else is 404.
func (s *Service) Get(ctx context.Context, tenantID, id uuid.UUID) (Invoice, error) {
	q := db.Querier(ctx, s.Pool)
	inv, err := s.load(ctx, q, id, false)
	if err != nil {
		return Invoice{}, err
	}
	if tenantID != uuid.Nil && (inv.TenantID != tenantID || inv.Status == StatusDraft) {
		return Invoice{}, notFound("invoice")
	}
	if inv.Lines, err = s.lines(ctx, q, id); err != nil {
		return Invoice{}, err
	}
	return inv, nil
}

// Filter narrows a list.
type Filter struct {
	TenantID   uuid.UUID // uuid.Nil: every tenant (admin)
	HideDrafts bool      // tenants never see drafts
	Status     *string
	From, To   *time.Time // keep invoices whose period overlaps [From, To)
	After      *Position  // keyset: strictly after this position
	Limit      int
}

// Position is a list position: newest period first, then id descending.
type Position struct {
	PeriodStart time.Time `json:"s"`
	ID          uuid.UUID `json:"i"`
}

// List returns up to f.Limit invoices and whether more follow.
func (s *Service) List(ctx context.Context, f Filter) ([]Invoice, bool, error) {
	sql := `SELECT ` + invoiceColumns + ` FROM billing_invoices WHERE true`
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	if f.TenantID != uuid.Nil {
		sql += ` AND tenant_id = ` + arg(f.TenantID)
	}
	if f.HideDrafts {
		sql += ` AND status <> 'draft'`
	}
	if f.Status != nil {
		sql += ` AND status = ` + arg(*f.Status)
	}
	if f.From != nil {
		sql += ` AND period_end > ` + arg(*f.From)
	}
	if f.To != nil {
		sql += ` AND period_start < ` + arg(*f.To)
	}
	if f.After != nil {
		sql += fmt.Sprintf(` AND (period_start, id) < (%s, %s)`, arg(f.After.PeriodStart), arg(f.After.ID))
	}
	sql += ` ORDER BY period_start DESC, id DESC LIMIT ` + arg(f.Limit+1)
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, sql, args...)
	if err != nil {
		return nil, false, fmt.Errorf("list invoices: %w", err)
	}
	defer rows.Close()
	var out []Invoice
	for rows.Next() {
		inv, err := scanInvoice(rows)
		if err != nil {
			return nil, false, err
		}
		out = append(out, inv)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	more := len(out) > f.Limit
	if more {
		out = out[:f.Limit]
	}
	return out, more, nil
}

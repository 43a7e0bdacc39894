package invoices

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// prefixOf is the number prefix of a seller: GNT for the platform, R<first 8 hex digits
// of the reseller tenant> for a reseller.
func prefixOf(sellerKey string) string {
	if rest, ok := strings.CutPrefix(sellerKey, "reseller:"); ok && len(rest) >= 8 {
		return "R" + strings.ToUpper(rest[:8])
	}
	return "GNT"
}

// transition records a status change of inv (already written) in its history and the
// transition counter.
func (s *Service) transition(ctx context.Context, tx pgx.Tx, invoiceID uuid.UUID, from, to string, ev Event, now time.Time) error {
	actor := uuid.NullUUID{}
	if p, ok := principal.From(ctx); ok {
		actor = uuid.NullUUID{UUID: p.UserID, Valid: p.UserID != uuid.Nil}
	}
	_, err := tx.Exec(ctx, `INSERT INTO billing_invoice_transitions (id, invoice_id, from_status, to_status, event, actor_user_id, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, s.IDs.New(), invoiceID, from, to, string(ev), actor, now)
	if err != nil {
		return fmt.Errorf("invoice history: %w", err)
	}
	return nil
}

// counted bumps the transition counters once the transaction committed.
func (s *Service) counted(statuses ...string) {
	for _, st := range statuses {
		s.Metrics.Transitions.WithLabelValues(st).Inc()
	}
}

// Issue freezes a draft and gives it the next number of its seller (allocated in this
// transaction: concurrent issuers queue on the seller's row, and a rolled-back issue
// gives its number back, so numbers have no gaps). An amount left to collect after the
// prepaid part makes it due at once (due_at = issue + payment terms); a fully prepaid
// invoice stays issued.
func (s *Service) Issue(ctx context.Context, id uuid.UUID) (Invoice, error) {
	var inv Invoice
	var entered []string
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		entered = nil
		inv, err = s.load(ctx, tx, id, true)
		if err != nil {
			return err
		}
		from := inv.Status
		if inv.Status, err = Next(from, EvIssue); err != nil {
			return err
		}
		if inv.Lines, err = s.lines(ctx, tx, id); err != nil {
			return err
		}
		if err := Check(inv.Totals, amounted(inv.Lines)); err != nil {
			return fmt.Errorf("invoices: %s: %w", id, err)
		}
		var seq int64
		err = tx.QueryRow(ctx, `INSERT INTO billing_invoice_sequences (seller_key, prefix, last_number) VALUES ($1, $2, 1)
			ON CONFLICT (seller_key) DO UPDATE SET last_number = billing_invoice_sequences.last_number + 1
			RETURNING last_number`, inv.SellerKey, prefixOf(inv.SellerKey)).Scan(&seq)
		if err != nil {
			return fmt.Errorf("invoice number: %w", err)
		}
		var prefix string
		if err := tx.QueryRow(ctx, `SELECT prefix FROM billing_invoice_sequences WHERE seller_key = $1`, inv.SellerKey).Scan(&prefix); err != nil {
			return fmt.Errorf("invoice number: %w", err)
		}
		number := fmt.Sprintf("%s-%06d", prefix, seq)
		now := s.Clock.Now()
		due := now.AddDate(0, 0, inv.PaymentTermsDays)
		inv.Number, inv.IssuedAt, inv.FinalizedAt, inv.DueAt, inv.UpdatedAt = &number, &now, &now, &due, now
		if err := s.transition(ctx, tx, id, from, StatusIssued, EvIssue, now); err != nil {
			return err
		}
		entered = append(entered, StatusIssued)
		if inv.AmountDue() > 0 {
			if inv.Status, err = Next(StatusIssued, EvOpen); err != nil {
				return err
			}
			if err := s.transition(ctx, tx, id, StatusIssued, StatusDue, EvOpen, now); err != nil {
				return err
			}
			entered = append(entered, StatusDue)
		}
		_, err = tx.Exec(ctx, `UPDATE billing_invoices SET status = $2, sequence_number = $3, number = $4, issued_at = $5,
			finalized_at = $5, due_at = $6, updated_at = $5 WHERE id = $1`, id, inv.Status, seq, number, now, due)
		if err != nil {
			return fmt.Errorf("issue invoice: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.invoice.issue", TargetType: "invoice", TargetID: id.String(), TenantID: inv.TenantID,
			Metadata: map[string]any{"number": number, "status": inv.Status, "total_minor": inv.Totals.Total, "currency": inv.Currency},
		}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventIssued, inv)
	})
	if err != nil {
		return Invoice{}, err
	}
	s.counted(entered...)
	return inv, nil
}

// Void cancels an invoice that has taken no payment since it was issued (draft, issued
// or due). What the prepaid wallet paid of its charges is re-credited exactly, in the
// same transaction (reference invoice-void:<id>); the caller must ask for it (recredit),
// otherwise an invoice with a prepaid part is refused (409 void_requires_recredit). A
// partially paid or paid invoice is refused: refund its payments first.
func (s *Service) Void(ctx context.Context, id uuid.UUID, reason string, recredit bool) (Invoice, error) {
	if len(reason) > 500 {
		return Invoice{}, apierr.Validation("reason", "reason is longer than 500 characters").With("reason", "too_long")
	}
	var inv Invoice
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		inv, err = s.load(ctx, tx, id, true)
		if err != nil {
			return err
		}
		from := inv.Status
		if inv.Status, err = Next(from, EvVoid); err != nil {
			return err
		}
		if inv.Paid != 0 {
			return stateInvalid(from, EvVoid).With("paid_minor", inv.Paid)
		}
		if inv.Totals.Prepaid > 0 && !recredit {
			return conflict("void_requires_recredit", "the prepaid balance paid %s of this invoice: void it with recredit",
				FormatMoney(inv.Totals.Prepaid, inv.Currency)).With("prepaid_minor", inv.Totals.Prepaid).With("status", from)
		}
		now := s.Clock.Now()
		var recreditTxn uuid.NullUUID
		if inv.Totals.Prepaid > 0 {
			posted, err := s.Ledger.Post(ctx, tx, billing.Posting{
				Kind: billing.TxnAdjustment, TenantID: inv.TenantID, Reference: "invoice-void:" + id.String(),
				Memo: "Re-credit of voided invoice " + deref(inv.Number, id.String()),
				Legs: []billing.Leg{
					{Account: billing.AccountKey{Kind: billing.AccountWallet, TenantID: inv.TenantID, Currency: inv.Currency}, Amount: inv.Totals.Prepaid},
					{Account: billing.AccountKey{Kind: billing.AccountRevenue, Currency: inv.Currency}, Amount: -inv.Totals.Prepaid},
				},
			})
			if err != nil {
				return err
			}
			recreditTxn = uuid.NullUUID{UUID: posted.TxnID, Valid: true}
			// The re-credit belongs to this invoice, not to the next one's payments.
			if _, err := tx.Exec(ctx, `INSERT INTO billing_invoice_txn_claims (ledger_txn_id, invoice_id) VALUES ($1, $2)
				ON CONFLICT DO NOTHING`, posted.TxnID, id); err != nil {
				return fmt.Errorf("claim re-credit: %w", err)
			}
		}
		// The charge is undone: what the wallet could not cover comes off the receivable
		// too, or a later top-up would still settle it first.
		cleared, err := s.clearReceivable(ctx, tx, inv, billing.AccountRevenue, "invoice-void-receivable:",
			"Receivable of voided invoice ")
		if err != nil {
			return err
		}
		var why *string
		if strings.TrimSpace(reason) != "" {
			why = &reason
		}
		inv.VoidedAt, inv.UpdatedAt = &now, now
		if _, err := tx.Exec(ctx, `UPDATE billing_invoices SET status = 'void', voided_at = $2, void_reason = $3, recredit_txn_id = $4,
			updated_at = $2 WHERE id = $1`, id, now, why, recreditTxn); err != nil {
			return fmt.Errorf("void invoice: %w", err)
		}
		if err := s.transition(ctx, tx, id, from, StatusVoid, EvVoid, now); err != nil {
			return err
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.invoice.void", TargetType: "invoice", TargetID: id.String(), TenantID: inv.TenantID,
			Metadata: map[string]any{"from_status": from, "recredit_minor": inv.Totals.Prepaid, "receivable_cleared_minor": cleared,
				"currency": inv.Currency, "reason": reason},
		}); err != nil {
			return err
		}
		return s.enqueue(ctx, tx, EventVoided, inv)
	})
	if err != nil {
		return Invoice{}, err
	}
	s.counted(StatusVoid)
	return inv, nil
}

// WriteOff gives up on what is left to collect of a due or partially paid invoice.
func (s *Service) WriteOff(ctx context.Context, id uuid.UUID, reason string) (Invoice, error) {
	if len(reason) > 500 {
		return Invoice{}, apierr.Validation("reason", "reason is longer than 500 characters").With("reason", "too_long")
	}
	var inv Invoice
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		inv, err = s.load(ctx, tx, id, true)
		if err != nil {
			return err
		}
		from := inv.Status
		if inv.Status, err = Next(from, EvWriteOff); err != nil {
			return err
		}
		// Given up: the tenant no longer owes it, so it comes off the receivable as a loss
		// (the adjustments account), or a later top-up would still settle it first.
		cleared, err := s.clearReceivable(ctx, tx, inv, billing.AccountAdjustments, "invoice-write-off:",
			"Write-off of invoice ")
		if err != nil {
			return err
		}
		now := s.Clock.Now()
		inv.WrittenOffAt, inv.UpdatedAt = &now, now
		if _, err := tx.Exec(ctx, `UPDATE billing_invoices SET status = 'write_off', written_off_at = $2, updated_at = $2 WHERE id = $1`, id, now); err != nil {
			return fmt.Errorf("write off invoice: %w", err)
		}
		if err := s.transition(ctx, tx, id, from, StatusWriteOff, EvWriteOff, now); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "billing.invoice.write_off", TargetType: "invoice", TargetID: id.String(), TenantID: inv.TenantID,
			Metadata: map[string]any{"from_status": from, "written_off_minor": inv.AmountDue(), "receivable_cleared_minor": cleared,
				"currency": inv.Currency, "reason": reason},
		})
	})
	if err != nil {
		return Invoice{}, err
	}
	s.counted(StatusWriteOff)
	return inv, nil
}

// clearReceivable takes what is still due on inv off the tenant's receivable, against
// counterpart, in tx: at most the amount due and at most what the receivable owes now
// (money that arrived since may already have settled part of it; the next close applies
// that to the invoice). The receivable is locked first, so two invoices cleared at once
// never take it past zero. The posting is claimed by inv, so no close reads it as a
// payment. It returns the amount cleared.
func (s *Service) clearReceivable(ctx context.Context, tx pgx.Tx, inv Invoice, counterpart, refPrefix, memo string) (int64, error) {
	due := inv.AmountDue()
	if due <= 0 {
		return 0, nil
	}
	var balance int64
	err := tx.QueryRow(ctx, `SELECT balance_minor FROM billing_ledger_accounts
		WHERE kind = $1 AND tenant_id = $2 AND currency = $3 FOR UPDATE`, billing.AccountReceivable, inv.TenantID, inv.Currency).Scan(&balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil // nothing was ever booked as owed
	}
	if err != nil {
		return 0, fmt.Errorf("lock receivable: %w", err)
	}
	amount := min(due, max(-balance, 0))
	if amount == 0 {
		return 0, nil
	}
	posted, err := s.Ledger.Post(ctx, tx, billing.Posting{
		Kind: billing.TxnAdjustment, TenantID: inv.TenantID, Reference: refPrefix + inv.ID.String(),
		Memo: memo + deref(inv.Number, inv.ID.String()),
		Legs: []billing.Leg{
			{Account: billing.AccountKey{Kind: billing.AccountReceivable, TenantID: inv.TenantID, Currency: inv.Currency}, Amount: amount},
			{Account: billing.AccountKey{Kind: counterpart, Currency: inv.Currency}, Amount: -amount},
		},
	})
	if err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO billing_invoice_txn_claims (ledger_txn_id, invoice_id) VALUES ($1, $2)
		ON CONFLICT DO NOTHING`, posted.TxnID, inv.ID); err != nil {
		return 0, fmt.Errorf("claim receivable posting: %w", err)
	}
	return amount, nil
}

// Payment is money applied to an issued invoice.
type Payment struct {
	InvoiceID uuid.UUID
	Amount    int64
	Currency  string
	// Reference names what pays ("payment:<id>", "arrears:<txn>"): applying the same
	// reference again changes nothing.
	Reference string
	PaymentID uuid.NullUUID
}

// Pay applies p in its own transaction.
func (s *Service) Pay(ctx context.Context, p Payment) (Invoice, error) {
	var inv Invoice
	var entered string
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		inv, entered, err = s.ApplyPayment(ctx, tx, p)
		return err
	})
	if err != nil {
		return Invoice{}, err
	}
	if entered != "" {
		s.counted(entered)
	}
	return inv, nil
}

// ApplyPayment applies p within tx (the caller's, when money arrives): due or partially
// paid → partially_paid or paid. More than the amount due, another currency, or an
// invoice with nothing to collect are refused; a replayed reference returns the invoice
// unchanged. entered is the status entered ("" on a replay).
func (s *Service) ApplyPayment(ctx context.Context, tx pgx.Tx, p Payment) (inv Invoice, entered string, err error) {
	if p.Amount <= 0 {
		return Invoice{}, "", apierr.Validation("amount_minor", "amount must be greater than zero").With("reason", "not_positive")
	}
	if p.Reference == "" || len(p.Reference) > 300 {
		return Invoice{}, "", apierr.Validation("reference", "reference must be 1..300 characters").With("reason", "invalid_reference")
	}
	inv, err = s.load(ctx, tx, p.InvoiceID, true)
	if err != nil {
		return Invoice{}, "", err
	}
	var prevInvoice uuid.UUID
	var prevAmount int64
	err = tx.QueryRow(ctx, `SELECT invoice_id, amount_minor FROM billing_invoice_payments WHERE reference = $1`, p.Reference).Scan(&prevInvoice, &prevAmount)
	switch {
	case err == nil:
		if prevInvoice != p.InvoiceID || prevAmount != p.Amount {
			return Invoice{}, "", conflict("reference_conflict", "this payment reference was applied to something else")
		}
		return inv, "", nil
	case !errors.Is(err, pgx.ErrNoRows):
		return Invoice{}, "", fmt.Errorf("invoice payment: %w", err)
	}
	if p.Currency != inv.Currency {
		return Invoice{}, "", apierr.New(apierr.ValidationError, "the payment is in %s, the invoice in %s", p.Currency, inv.Currency).
			WithStatus(422).With("reason", "currency_mismatch")
	}
	due := inv.AmountDue()
	ev := EvPayPartial
	if p.Amount == due {
		ev = EvPayInFull
	}
	from := inv.Status
	if inv.Status, err = Next(from, ev); err != nil {
		return Invoice{}, "", err
	}
	if p.Amount > due {
		return Invoice{}, "", apierr.Validation("amount_minor", "the payment of %d exceeds the %d due", p.Amount, due).With("reason", "overpayment")
	}
	now := s.Clock.Now()
	inv.Paid += p.Amount
	inv.UpdatedAt = now
	if inv.Status == StatusPaid {
		inv.PaidAt = &now
	}
	if _, err := tx.Exec(ctx, `INSERT INTO billing_invoice_payments (id, invoice_id, reference, amount_minor, payment_id, created_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, s.IDs.New(), p.InvoiceID, p.Reference, p.Amount, p.PaymentID, now); err != nil {
		return Invoice{}, "", fmt.Errorf("invoice payment: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE billing_invoices SET status = $2, paid_minor = $3, paid_at = $4, updated_at = $5 WHERE id = $1`,
		p.InvoiceID, inv.Status, inv.Paid, inv.PaidAt, now); err != nil {
		return Invoice{}, "", fmt.Errorf("invoice payment: %w", err)
	}
	if err := s.transition(ctx, tx, p.InvoiceID, from, inv.Status, ev, now); err != nil {
		return Invoice{}, "", err
	}
	if inv.Status == StatusPaid {
		if err := s.enqueue(ctx, tx, EventPaid, inv); err != nil {
			return Invoice{}, "", err
		}
	}
	return inv, inv.Status, nil
}

// OpenInvoices are the tenant's due and partially paid invoices in currency, oldest
// first: what money arriving for arrears pays (ApplyPayment on each in turn).
func (s *Service) OpenInvoices(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string) ([]Invoice, error) {
	rows, err := tx.Query(ctx, `SELECT `+invoiceColumns+` FROM billing_invoices
		WHERE tenant_id = $1 AND currency = $2 AND status IN ('due', 'partially_paid') ORDER BY period_start, id`, tenantID, currency)
	if err != nil {
		return nil, fmt.Errorf("open invoices: %w", err)
	}
	defer rows.Close()
	var out []Invoice
	for rows.Next() {
		inv, err := scanInvoice(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, inv)
	}
	return out, rows.Err()
}

func deref(s *string, def string) string {
	if s == nil {
		return def
	}
	return *s
}

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
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Period is one account's billing period in one currency: [Start, End).
type Period struct {
	TenantID uuid.UUID
	Currency string
	Start    time.Time
	End      time.Time
}

// MonthOf is the calendar month (UTC) that contains t.
func MonthOf(t time.Time) (start, end time.Time) {
	t = t.UTC()
	start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

func (p Period) validate(now time.Time) error {
	if p.TenantID == uuid.Nil {
		return apierr.Validation("tenant_id", "a tenant is required").With("reason", "required")
	}
	if _, ok := billing.Exponent(p.Currency); !ok {
		return apierr.Validation("currency", "currency %q is not supported", p.Currency).With("reason", "unsupported_currency")
	}
	if !p.End.After(p.Start) {
		return apierr.Validation("period_end", "the period must end after it starts").With("reason", "empty_period")
	}
	if p.End.After(now) {
		return apierr.Validation("period_end", "the period has not ended yet").With("reason", "period_open")
	}
	return nil
}

// Closed is the result of a close.
type Closed struct {
	Invoice Invoice
	Created bool // false: the period was closed before and this is that invoice

	entered []string // statuses entered by invoices the close's settlements paid
}

// Close builds the draft invoice of p, or returns the one an earlier close of the same
// period built (idempotent: safe to re-run, also concurrently). A different period that
// overlaps one already invoiced is refused (409 invoice_period_overlap).
//
// The draft takes every rated usage line of the tenant in p's currency that starts
// before p ends and is on no invoice yet (late usage of an earlier, already closed
// period becomes a correction line here, never a change of the issued invoice), the
// ledger's adjustments (debits are charges), usage reversals (credits) and money received
// (top-ups and wallet credits, as payment lines), then the tax lines of the account's
// treatment. Its totals are checked against its lines before it is written.
func (s *Service) Close(ctx context.Context, p Period) (Closed, error) {
	p.Start, p.End = p.Start.UTC(), p.End.UTC()
	if err := p.validate(s.Clock.Now()); err != nil {
		return Closed{}, err
	}
	var out Closed
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = s.closeTx(ctx, tx, p)
		return err
	})
	if err != nil {
		return Closed{}, err
	}
	if out.Created {
		s.Metrics.Closed.Inc()
	}
	s.counted(out.entered...)
	return out, nil
}

func (s *Service) closeTx(ctx context.Context, tx pgx.Tx, p Period) (Closed, error) {
	// One close per tenant and currency at a time: the overlap check below and the claims
	// must see every earlier close.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('invoice-close:' || $1::text || ':' || $2::text, 0))`, p.TenantID, p.Currency); err != nil {
		return Closed{}, fmt.Errorf("close lock: %w", err)
	}
	var existing uuid.UUID
	var exStart, exEnd time.Time
	err := tx.QueryRow(ctx, `SELECT id, period_start, period_end FROM billing_invoices
		WHERE tenant_id = $1 AND currency = $2 AND period_start < $4 AND period_end > $3
		ORDER BY period_start LIMIT 1`, p.TenantID, p.Currency, p.Start, p.End).Scan(&existing, &exStart, &exEnd)
	switch {
	case err == nil:
		if exStart.Equal(p.Start) && exEnd.Equal(p.End) {
			inv, err := s.load(ctx, tx, existing, false)
			return Closed{Invoice: inv}, err
		}
		return Closed{}, conflict("invoice_period_overlap", "the period overlaps the invoiced period %s to %s",
			exStart.Format(time.RFC3339), exEnd.Format(time.RFC3339)).With("invoice_id", existing.String())
	case !errors.Is(err, pgx.ErrNoRows):
		return Closed{}, fmt.Errorf("close overlap: %w", err)
	}

	acct, err := s.Accounts.InvoiceAccount(ctx, tx, p.TenantID, p.Currency)
	if err != nil {
		return Closed{}, err
	}
	if err := acct.Tax.Validate(); err != nil {
		return Closed{}, err
	}
	d, err := s.collect(ctx, tx, p, acct)
	if err != nil {
		return Closed{}, err
	}
	inv, err := s.writeDraft(ctx, tx, p, acct, d)
	if err != nil {
		return Closed{}, err
	}
	entered, err := s.applySettlements(ctx, tx, p, d.settlements)
	if err != nil {
		return Closed{}, err
	}
	err = s.Audit.Record(ctx, tx, audit.Entry{
		Action: "billing.invoice.close", TargetType: "invoice", TargetID: inv.ID.String(), TenantID: inv.TenantID,
		ActorType: audit.ActorSystem,
		Metadata: map[string]any{
			"currency": p.Currency, "period_start": p.Start, "period_end": p.End, "lines": len(d.lines),
			"total_minor": inv.Totals.Total,
		},
	})
	if err != nil {
		return Closed{}, err
	}
	return Closed{Invoice: inv, Created: true, entered: entered}, nil
}

// applySettlements pays the tenant's open invoices (due, partially paid; oldest first)
// with arrears that money settled: the receivable they were owed on is paid. Each part
// is idempotent (reference arrears:<ledger txn>:<invoice>).
func (s *Service) applySettlements(ctx context.Context, tx pgx.Tx, p Period, settlements []settlement) ([]string, error) {
	if len(settlements) == 0 {
		return nil, nil
	}
	open, err := s.OpenInvoices(ctx, tx, p.TenantID, p.Currency)
	if err != nil {
		return nil, err
	}
	var entered []string
	for _, st := range settlements {
		left := st.amount
		for i := range open {
			due := open[i].AmountDue()
			if left == 0 {
				break
			}
			if due == 0 {
				continue
			}
			pay := min(due, left)
			inv, to, err := s.ApplyPayment(ctx, tx, Payment{InvoiceID: open[i].ID, Amount: pay, Currency: p.Currency,
				Reference: fmt.Sprintf("arrears:%s:%s", st.txnID, open[i].ID)})
			if err != nil {
				return nil, err
			}
			open[i] = inv
			left -= pay
			if to != "" {
				entered = append(entered, to)
			}
		}
	}
	return entered, nil
}

// draft is an invoice being built: its lines in order and what they claim.
type draft struct {
	lines     []Line
	txnIDs    []uuid.UUID // ledger transactions claimed
	prepaid   int64       // what the wallet already paid of the charges
	notes     []string
	corrected int // late usage lines from before the period
	// Arrears settled by money that arrived (receivable credits): applied to the
	// tenant's open invoices, oldest first, when the draft is written.
	settlements []settlement
}

type settlement struct {
	txnID  uuid.UUID
	amount int64
}

func (d *draft) add(l Line) int {
	l.Position = len(d.lines)
	d.lines = append(d.lines, l)
	return l.Position
}

// usageRow is a rated usage line with the wallet's share of its rating transaction.
type usageRow struct {
	id         uuid.UUID
	amount     int64
	billFrom   time.Time
	billTo     time.Time
	unit       string
	units      int64
	unitPrice  string
	source     string
	entryID    uuid.NullUUID
	txnID      uuid.NullUUID
	walletPaid int64
}

func (s *Service) collect(ctx context.Context, tx pgx.Tx, p Period, acct Account) (*draft, error) {
	d := &draft{}
	rows, err := tx.Query(ctx, `SELECT l.id, l.amount_minor, l.bill_from, l.bill_to, l.usage_unit, l.units, l.unit_price, l.usage_source,
			l.ledger_entry_id, e.txn_id,
			COALESCE((SELECT -sum(we.amount_minor) FROM billing_ledger_entries we
				JOIN billing_ledger_accounts wa ON wa.id = we.account_id
				WHERE we.txn_id = e.txn_id AND wa.kind = 'tenant_wallet'), 0)
		FROM billing_rated_usage_lines l
		LEFT JOIN billing_ledger_entries e ON e.id = l.ledger_entry_id
		WHERE l.tenant_id = $1 AND l.currency = $2 AND l.bill_from < $3
		  -- A wholesale line without a ledger entry is a platform-risk reseller's cost
		  -- statement (docs/billing-accounts.md): nothing was charged, so nothing is invoiced.
		  AND (l.rating_role = 'customer' OR l.ledger_entry_id IS NOT NULL)
		  AND NOT EXISTS (SELECT 1 FROM billing_invoice_lines c WHERE c.rated_usage_line_id = l.id)
		ORDER BY l.bill_from, l.id`, p.TenantID, p.Currency, p.End)
	if err != nil {
		return nil, fmt.Errorf("close usage: %w", err)
	}
	var usage []usageRow
	for rows.Next() {
		var u usageRow
		if err := rows.Scan(&u.id, &u.amount, &u.billFrom, &u.billTo, &u.unit, &u.units, &u.unitPrice, &u.source,
			&u.entryID, &u.txnID, &u.walletPaid); err != nil {
			rows.Close()
			return nil, err
		}
		usage = append(usage, u)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("close usage: %w", err)
	}

	charge := func(typ, desc, category string, amount int64) Line {
		l := Line{Type: typ, Description: desc, Currency: p.Currency, Amount: amount, TaxEvidence: map[string]any{}}
		t := acct.Tax
		switch t.Treatment {
		case TreatmentStandard:
			rate := t.RateFor(category)
			l.TaxCategory, l.TaxRateBps, l.TaxJurisdiction = &category, &rate, t.Jurisdiction
		case TreatmentReverseCharge:
			zero, note := 0, ReverseChargeNote
			l.TaxCategory, l.TaxRateBps, l.TaxJurisdiction, l.ReverseChargeReason = &category, &zero, t.Jurisdiction, &note
			l.TaxEvidence = t.Evidence
		case TreatmentTaxExempt:
			zero := 0
			l.TaxCategory, l.TaxRateBps, l.TaxJurisdiction, l.TaxExemptReason = &category, &zero, t.Jurisdiction, t.ExemptReason
			l.TaxEvidence = t.Evidence
		}
		return l
	}

	// The wallet pays a rating transaction before the receivable takes the rest; the
	// wallet's share is spread over the transaction's lines here in order.
	walletLeft := map[uuid.UUID]int64{}
	for _, u := range usage {
		if u.amount < 0 {
			return nil, fmt.Errorf("invoices: rated line %s has negative amount", u.id)
		}
		desc := fmt.Sprintf("%s usage (%s): %d units at %s, %s to %s", u.unit, u.source, u.units, u.unitPrice,
			u.billFrom.Format(time.RFC3339), u.billTo.Format(time.RFC3339))
		if u.billFrom.Before(p.Start) {
			desc = "Correction, late usage: " + desc
			d.corrected++
		}
		l := charge(LineRatedUsage, desc, CategoryCompute, u.amount)
		l.RatedUsageLineID = uuid.NullUUID{UUID: u.id, Valid: true}
		l.LedgerEntryID = u.entryID
		d.add(l)
		if u.txnID.Valid {
			left, seen := walletLeft[u.txnID.UUID]
			if !seen {
				left = u.walletPaid
			}
			paid := min(left, u.amount)
			walletLeft[u.txnID.UUID] = left - paid
			d.prepaid += paid
		}
	}

	// Ledger movements of the tenant in this currency, not yet on an invoice (usage
	// postings are the rated lines above). Money arriving settles arrears first
	// (billing.Ledger.ArrearsFirst): its receivable leg is money received too.
	trows, err := tx.Query(ctx, `SELECT t.id, t.kind, t.reference, t.memo,
			COALESCE(sum(e.amount_minor) FILTER (WHERE a.kind = 'tenant_wallet' AND a.tenant_id = $1), 0),
			COALESCE(sum(e.amount_minor) FILTER (WHERE a.kind = 'tenant_receivable' AND a.tenant_id = $1), 0),
			COALESCE(sum(e.amount_minor) FILTER (WHERE a.kind = 'platform_revenue'), 0),
			count(*) FILTER (WHERE a.kind = 'adjustments') > 0
		FROM billing_ledger_transactions t
		JOIN billing_ledger_entries e ON e.txn_id = t.id
		JOIN billing_ledger_accounts a ON a.id = e.account_id
		WHERE t.tenant_id = $1 AND t.kind <> 'usage' AND t.created_at < $3 AND e.currency = $2
		  AND NOT EXISTS (SELECT 1 FROM billing_invoice_txn_claims c WHERE c.ledger_txn_id = t.id)
		GROUP BY t.id ORDER BY min(t.created_at), t.id`, p.TenantID, p.Currency, p.End)
	if err != nil {
		return nil, fmt.Errorf("close ledger: %w", err)
	}
	type txnRow struct {
		id                          uuid.UUID
		kind, ref, memo             string
		wallet, receivable, revenue int64
		adjustments                 bool
	}
	var txns []txnRow
	for trows.Next() {
		var r txnRow
		if err := trows.Scan(&r.id, &r.kind, &r.ref, &r.memo, &r.wallet, &r.receivable, &r.revenue, &r.adjustments); err != nil {
			trows.Close()
			return nil, err
		}
		txns = append(txns, r)
	}
	trows.Close()
	if err := trows.Err(); err != nil {
		return nil, fmt.Errorf("close ledger: %w", err)
	}
	received := func(desc string, r txnRow) Line {
		if r.receivable > 0 {
			desc += fmt.Sprintf(" (%s settled arrears)", FormatMoney(r.receivable, p.Currency))
		}
		return Line{Type: LinePayment, Description: desc, Currency: p.Currency, Amount: r.wallet + r.receivable, TaxEvidence: map[string]any{}}
	}
	for _, r := range txns {
		memo := r.memo
		in := r.wallet + r.receivable
		switch {
		case r.kind == "top_up" && in > 0:
			l := received("Payment received", r)
			if id, err := uuid.Parse(strings.TrimPrefix(r.ref, "payment:")); err == nil && strings.HasPrefix(r.ref, "payment:") {
				l.PaymentSessionID = uuid.NullUUID{UUID: id, Valid: true}
			}
			d.add(l)
		case r.kind == "adjustment" && r.adjustments && in > 0:
			d.add(received(orDefault(memo, "Balance credit"), r))
		case r.kind == "adjustment" && r.adjustments && r.wallet < 0:
			// An admin debit is a charge the wallet paid at once.
			d.add(charge(LineAdjustment, orDefault(memo, "Adjustment"), "adjustment", -r.wallet))
			d.prepaid += -r.wallet
		case r.kind == "reversal" && r.revenue < 0:
			// A reversed usage posting: its revenue comes off as a credit, and what it gave
			// back to the wallet is no longer prepaid.
			d.add(Line{Type: LineCredit, Description: orDefault(memo, "Usage reversal"), Currency: p.Currency, Amount: -r.revenue, TaxEvidence: map[string]any{}})
			d.prepaid -= max(r.wallet, 0)
		case r.receivable > 0:
			// Arrears settled by some other movement.
			d.add(received(orDefault(memo, "Arrears settled"), r))
		}
		// Claimed whether or not it is a line (refunds, conversions): considered once.
		d.txnIDs = append(d.txnIDs, r.id)
		if r.receivable > 0 {
			d.settlements = append(d.settlements, settlement{txnID: r.id, amount: r.receivable})
		}
	}
	if d.prepaid < 0 {
		d.prepaid = 0
	}

	// Tax, over the charges.
	var taxable []Taxable
	for _, l := range d.lines {
		if isCharge(l.Type) && l.TaxCategory != nil {
			taxable = append(taxable, Taxable{Index: l.Position, Category: *l.TaxCategory, Amount: l.Amount})
		}
	}
	taxLines, err := ComputeTax(acct.Tax, taxable)
	if err != nil {
		return nil, err
	}
	for i := range d.lines {
		d.lines[i].ID = s.IDs.New()
	}
	for _, t := range taxLines {
		subjects := make([]string, len(t.Subjects))
		for i, idx := range t.Subjects {
			subjects[i] = d.lines[idx].ID.String()
		}
		cat, rate := t.Category, t.RateBps
		d.add(Line{
			ID: s.IDs.New(), Type: LineTax, Currency: p.Currency, Amount: t.Amount,
			Description: fmt.Sprintf("Tax %s at %s%%", cat, bpsPercent(rate)),
			TaxCategory: &cat, TaxRateBps: &rate, TaxJurisdiction: acct.Tax.Jurisdiction,
			TaxSubjectLineID: uuid.NullUUID{UUID: d.lines[t.Subjects[0]].ID, Valid: true},
			TaxEvidence:      map[string]any{"base_minor": t.Base, "rate_bps": rate, "subject_line_ids": subjects, "rounding": "half_away_from_zero"},
		})
	}
	switch acct.Tax.Treatment {
	case TreatmentReverseCharge:
		d.notes = append(d.notes, ReverseChargeNote)
	case TreatmentTaxExempt:
		d.notes = append(d.notes, "Exempt from tax: "+*acct.Tax.ExemptReason)
	}
	return d, nil
}

func isCharge(typ string) bool {
	return typ == LineRatedUsage || typ == LineFee || typ == LineAdjustment
}

func orDefault(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}

// bpsPercent spells basis points as a percentage: 1950 → "19.5".
func bpsPercent(bps int) string {
	s := fmt.Sprintf("%d.%02d", bps/100, bps%100)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func amounted(lines []Line) []Amounted {
	out := make([]Amounted, len(lines))
	for i, l := range lines {
		out[i] = Amounted{Type: l.Type, Amount: l.Amount}
	}
	return out
}

func (s *Service) writeDraft(ctx context.Context, tx pgx.Tx, p Period, acct Account, d *draft) (Invoice, error) {
	lineTotals, err := Sum(amounted(d.lines))
	if err != nil {
		return Invoice{}, err
	}
	// Payment lines record money received; the invoice's prepaid figure is what the
	// wallet paid of its charges.
	totals := lineTotals
	totals.Prepaid = d.prepaid
	if err := Check(totals, amounted(d.lines)); err != nil {
		return Invoice{}, err
	}
	now := s.Clock.Now()
	t := acct.Tax
	snapshot := map[string]any{
		"treatment": t.Treatment, "jurisdiction": t.Jurisdiction, "rates_bps": t.Rates, "default_rate_bps": t.DefaultRateBps,
		"seller_tax_registration": t.SellerRegistration, "customer_tax_registration": t.CustomerRegistration,
		"exempt_reason": t.ExemptReason, "evidence": t.Evidence, "rounding": "half_away_from_zero, once per (category, rate) line",
		"corrections": d.corrected, "received_minor": lineTotals.Received,
	}
	var note *string
	if len(d.notes) > 0 {
		n := strings.Join(d.notes, "\n")
		note = &n
	}
	inv := Invoice{
		ID: s.IDs.New(), TenantID: p.TenantID, BillingAccountID: acct.ID, SellerKey: acct.SellerKey, Currency: p.Currency,
		PeriodStart: p.Start, PeriodEnd: p.End, Status: StatusDraft, Totals: totals,
		TaxJurisdiction: t.Jurisdiction, TaxTreatment: t.Treatment, SellerTaxRegistration: t.SellerRegistration,
		CustomerTaxRegistration: t.CustomerRegistration, TaxSnapshot: snapshot, SellerName: acct.SellerName,
		CustomerName: acct.CustomerName, LegalNote: note, PaymentTermsDays: acct.PaymentTermsDays, CreatedAt: now, UpdatedAt: now,
	}
	_, err = tx.Exec(ctx, `INSERT INTO billing_invoices (id, tenant_id, billing_account_id, seller_key, currency, period_start, period_end,
			status, subtotal_minor, tax_total_minor, credits_minor, total_minor, prepaid_minor, tax_jurisdiction, tax_treatment,
			seller_tax_registration, customer_tax_registration, tax_snapshot, seller_name, customer_name, legal_note,
			payment_terms_days, created_at, updated_at, received_minor)
		VALUES ($1,$2,$3,$4,$5,$6,$7,'draft',$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$22,$23)`,
		inv.ID, inv.TenantID, inv.BillingAccountID, inv.SellerKey, inv.Currency, inv.PeriodStart, inv.PeriodEnd,
		totals.Subtotal, totals.Tax, totals.Credits, totals.Total, totals.Prepaid, inv.TaxJurisdiction, inv.TaxTreatment,
		inv.SellerTaxRegistration, inv.CustomerTaxRegistration, jsonOf(snapshot), inv.SellerName, inv.CustomerName, note,
		inv.PaymentTermsDays, now, totals.Received)
	if db.IsUniqueViolation(err, "billing_invoices_period_key") {
		return Invoice{}, conflict("invoice_period_overlap", "the period is already invoiced")
	}
	if err != nil {
		return Invoice{}, fmt.Errorf("insert invoice: %w", err)
	}
	if err := s.insertLines(ctx, tx, inv.ID, d.lines, now); err != nil {
		return Invoice{}, err
	}
	if len(d.txnIDs) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO billing_invoice_txn_claims (ledger_txn_id, invoice_id)
			SELECT unnest($1::uuid[]), $2`, d.txnIDs, inv.ID); err != nil {
			return Invoice{}, fmt.Errorf("claim ledger: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO billing_invoice_transitions (id, invoice_id, from_status, to_status, event, created_at)
		VALUES ($1, $2, NULL, 'draft', 'close', $3)`, s.IDs.New(), inv.ID, now); err != nil {
		return Invoice{}, fmt.Errorf("invoice history: %w", err)
	}
	for i := range d.lines {
		d.lines[i].CreatedAt = now
	}
	inv.Lines = d.lines
	return inv, nil
}

func (s *Service) insertLines(ctx context.Context, tx pgx.Tx, invoiceID uuid.UUID, lines []Line, now time.Time) error {
	if len(lines) == 0 {
		return nil
	}
	// COPY: one round trip, no statement to plan, the immutability check once.
	rows := make([][]any, len(lines))
	for i, l := range lines {
		var rate *int32
		if l.TaxRateBps != nil {
			r := int32(*l.TaxRateBps)
			rate = &r
		}
		rows[i] = []any{l.ID, invoiceID, int32(l.Position), l.Type, l.Description, l.Currency, l.Amount, l.RatedUsageLineID,
			l.LedgerEntryID, l.PaymentSessionID, l.TaxCategory, rate, l.TaxJurisdiction, l.TaxSubjectLineID, l.TaxExemptReason,
			l.ReverseChargeReason, jsonOf(l.TaxEvidence), now}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"billing_invoice_lines"}, []string{"id", "invoice_id", "position", "line_type",
		"description", "currency", "amount_minor", "rated_usage_line_id", "ledger_entry_id", "payment_session_id", "tax_category",
		"tax_rate_bps", "tax_jurisdiction", "tax_subject_line_id", "tax_exempt_reason", "reverse_charge_reason", "tax_evidence",
		"created_at"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("insert invoice lines: %w", err)
	}
	return nil
}

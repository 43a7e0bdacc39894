package billing

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
)

// Reseller rating (docs/billing-accounts.md). The usage of an end customer (a tenant
// whose billing account is an end_customer of a reseller) is rated twice under one
// rating event: at the customer's plan on the end customer's own tenant (as every
// tenant's usage), and at the wholesale plan on the reseller's tenant (rating_role
// wholesale, rating keys "<key>/wholesale/<n>"). Exactly one side moves money: the
// credit_risk_owner's. With reseller risk the reseller's wallet (then receivable) pays
// the wholesale amount and the customer-priced lines are the reseller's to invoice; with
// platform risk the end customer's wallet pays the customer amount and the wholesale
// lines are the reseller's statement. A wholesale line never names the end customer's
// project or users (requested_by_user_id is the nil uuid): a reseller is a payer, not an
// actor of its customer.

// Credit risk owners.
const (
	RiskPlatform = "platform"
	RiskReseller = "reseller"
)

// resale is the wholesale side of one usage record.
type resale struct {
	reseller uuid.UUID
	plan     uuid.NullUUID
	owner    string
	st       runState
	pieces   []ratedPiece
	total    int64
}

// loadResales finds, for the locked records, those of end customers and their
// wholesale rating state. A record of a tenant that is no (or a deleted) end customer is
// absent.
func loadResales(ctx context.Context, tx pgx.Tx, recs []billingdb.BillingUsageRecord) (map[uuid.UUID]*resale, error) {
	out := map[uuid.UUID]*resale{}
	if len(recs) == 0 {
		return out, nil
	}
	ids := make([]uuid.UUID, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	rows, err := tx.Query(ctx, `SELECT r.id, a.reseller_tenant_id, a.wholesale_pricing_plan_id, a.credit_risk_owner,
			COALESCE(r.ws_rated_through, r.bill_from), COALESCE(r.ws_seg_from, r.bill_from), r.ws_seg_units, r.ws_seg_amount_minor
		FROM billing_usage_records r
		JOIN billing_accounts a ON a.tenant_id = r.tenant_id AND a.account_type = 'end_customer' AND a.status <> 'deleted'
		WHERE r.id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("resales: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var rs resale
		if err := rows.Scan(&id, &rs.reseller, &rs.plan, &rs.owner, &rs.st.ratedThrough, &rs.st.segFrom, &rs.st.segUnits, &rs.st.segAmount); err != nil {
			return nil, fmt.Errorf("resales: %w", err)
		}
		out[id] = &rs
	}
	return out, rows.Err()
}

// wholesaleLineColumns are CopyRatedLines' columns plus rating_role.
var wholesaleLineColumns = []string{"id", "usage_record_id", "tenant_id", "project_id", "requested_by_user_id", "usage_source",
	"usage_unit", "segment_from", "bill_from", "bill_to", "unit_quantity_millis", "units", "cumulative_units", "currency",
	"unit_price", "amount_minor", "amount_exact", "cumulative_amount_minor", "pricing_source", "pricing_plan_id",
	"pricing_plan_version", "pricing_snapshot", "fx_snapshot_id", "rating_event_key", "rating_key", "ledger_entry_id",
	"created_at", "rating_role"}

func copyWholesaleLines(ctx context.Context, tx pgx.Tx, lines []billingdb.CopyRatedLinesParams) error {
	if len(lines) == 0 {
		return nil
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"billing_rated_usage_lines"}, wholesaleLineColumns,
		pgx.CopyFromSlice(len(lines), func(i int) ([]any, error) {
			l := lines[i]
			return []any{l.ID, l.UsageRecordID, l.TenantID, l.ProjectID, l.RequestedByUserID, l.UsageSource, l.UsageUnit,
				l.SegmentFrom, l.BillFrom, l.BillTo, l.UnitQuantityMillis, l.Units, l.CumulativeUnits, l.Currency, l.UnitPrice,
				l.AmountMinor, l.AmountExact, l.CumulativeAmountMinor, l.PricingSource, l.PricingPlanID, l.PricingPlanVersion,
				l.PricingSnapshot, l.FxSnapshotID, l.RatingEventKey, l.RatingKey, l.LedgerEntryID, l.CreatedAt, "wholesale"}, nil
		}))
	if err != nil {
		return fmt.Errorf("wholesale lines: %w", err)
	}
	return nil
}

// wholesaleState records where the wholesale rating of each record stands.
type wholesaleState struct {
	ids      []uuid.UUID
	throughs []time.Time
	segFroms []time.Time
	units    []int64
	amounts  []int64
}

func (w *wholesaleState) add(id uuid.UUID, st runState) {
	w.ids = append(w.ids, id)
	w.throughs = append(w.throughs, st.ratedThrough)
	w.segFroms = append(w.segFroms, st.segFrom)
	w.units = append(w.units, st.segUnits)
	w.amounts = append(w.amounts, st.segAmount)
}

func (w *wholesaleState) write(ctx context.Context, tx pgx.Tx) error {
	if len(w.ids) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `UPDATE billing_usage_records r SET ws_rated_through = u.t, ws_seg_from = u.f,
			ws_seg_units = u.n, ws_seg_amount_minor = u.a
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::bigint[], $5::bigint[]) AS u(id, t, f, n, a)
		WHERE r.id = u.id`, w.ids, w.throughs, w.segFroms, w.units, w.amounts)
	if err != nil {
		return fmt.Errorf("wholesale state: %w", err)
	}
	return nil
}

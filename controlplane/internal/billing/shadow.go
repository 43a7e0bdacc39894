package billing

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// ShadowLine is the dry-run re-rating of one usage record at a candidate price.
type ShadowLine struct {
	Record                     UsageRecord
	Existing, Candidate, Delta int64
	Units, QuantityMillis      int64
	BillFrom, BillTo           time.Time
	CandidateKey               string
}

// ShadowRate re-rates the records (1..100 ids of the tenant) at candidate (minor units
// per unit) over exactly the segments already rated, and compares with what was booked.
// It only reads: no ledger entry, rated line, event or audit row is written. With the
// candidate equal to the booked price every delta is zero (each segment is re-rated the
// same way: price × cumulative units, rounded once).
func (s *Service) ShadowRate(ctx context.Context, tenantID uuid.UUID, ids []uuid.UUID, candidate Money) ([]ShadowLine, error) {
	if len(ids) < 1 || len(ids) > 100 {
		return nil, apierr.Validation("usage_record_ids", "give 1 to 100 usage record ids").With("reason", "count")
	}
	seen := map[uuid.UUID]bool{}
	for _, id := range ids {
		if seen[id] {
			return nil, apierr.Validation("usage_record_ids", "usage record %s appears twice", id).With("reason", "duplicate")
		}
		seen[id] = true
	}
	if err := checkCurrency("candidate_unit_price.currency", candidate.Currency); err != nil {
		return nil, err
	}
	if candidate.AmountMinor < 0 {
		return nil, apierr.Validation("candidate_unit_price.amount_minor", "the candidate price may not be negative")
	}
	q := s.read(ctx)
	recs, err := q.RecordsByID(ctx, billingdbRecordsByID(tenantID, ids))
	if err != nil {
		return nil, fmt.Errorf("usage records: %w", err)
	}
	if len(recs) != len(ids) {
		var missing []string
		for _, id := range ids {
			found := false
			for _, r := range recs {
				found = found || r.ID == id
			}
			if !found {
				missing = append(missing, id.String())
			}
		}
		return nil, apierr.New(apierr.InvalidRequest, "usage records not found").WithStatus(404).With("reason", "not_found").
			With("usage_record_ids", missing)
	}
	for _, r := range recs {
		if r.Currency != candidate.Currency {
			return nil, apierr.Validation("candidate_unit_price.currency", "usage record %s is billed in %s", r.ID, r.Currency).
				With("reason", "currency_mismatch")
		}
	}
	totals, err := q.RecordLineTotals(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("rated totals: %w", err)
	}
	byID := map[uuid.UUID]*ShadowLine{}
	out := make([]ShadowLine, 0, len(ids))
	for _, id := range ids {
		for _, r := range recs {
			if r.ID == id {
				out = append(out, ShadowLine{Record: r, BillFrom: r.BillFrom, BillTo: r.RatedThrough, QuantityMillis: r.RatedQuantityMillis,
					CandidateKey: "shadow:" + r.ID.String() + ":" + candidate.Currency + ":" + strconv.FormatInt(candidate.AmountMinor, 10) +
						"@" + strconv.FormatInt(r.RatedThrough.UnixMilli(), 10)})
			}
		}
	}
	for i := range out {
		byID[out[i].Record.ID] = &out[i]
	}
	for _, t := range totals {
		l := byID[t.UsageRecordID]
		l.Existing += t.CumulativeAmountMinor
		l.Units += t.CumulativeUnits
		// candidate is a whole number of minor units per unit: its product is exact.
		l.Candidate += candidate.AmountMinor * t.CumulativeUnits
	}
	for i := range out {
		out[i].Delta = out[i].Candidate - out[i].Existing
	}
	return out, nil
}

func billingdbRecordsByID(tenantID uuid.UUID, ids []uuid.UUID) billingdb.RecordsByIDParams {
	return billingdb.RecordsByIDParams{TenantID: tenantID, Ids: ids}
}

package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
)

// Accrued is what the usage of each source (e.g. each allocation) has cost so far at
// now: the amounts booked by rating over every run of the source, open or closed, plus
// the part of a run not rated yet (an open run up to now, a closed run up to its end),
// priced exactly as the next rating will book it (same segments, same rounding), so
// the figure only ever grows and equals the booked total once rating catches up.
// Sources without usage are absent from the map. A source's runs share its currency
// (an allocation is billed in the currency priced at launch); if they did not, the
// latest run's currency is reported and the others are left out rather than summed
// across currencies. A unit that has lost its price leaves the unrated part out
// instead of failing the read. It writes nothing.
func (s *Service) Accrued(ctx context.Context, source string, sourceIDs []uuid.UUID, now time.Time) (map[uuid.UUID]Money, error) {
	out := map[uuid.UUID]Money{}
	if len(sourceIDs) == 0 {
		return out, nil
	}
	conn := db.Querier(ctx, s.Pool)
	// Inline rather than in queries.sql: a read that only this file makes, over
	// billing's own tables (billing_usage_records_source_idx, migration 00350).
	rows, err := conn.Query(ctx, `
SELECT r.id, r.source_id, r.tenant_id, r.currency, r.usage_unit, r.quantity, r.bill_from, r.bill_to,
       r.rated_through, r.seg_from, r.seg_units, r.seg_amount_minor,
       coalesce((SELECT sum(l.amount_minor) FROM billing_rated_usage_lines l WHERE l.usage_record_id = r.id), 0)::bigint
FROM billing_usage_records r
WHERE r.source = $1 AND r.source_id = ANY($2::uuid[])
ORDER BY r.source_id, r.bill_from DESC, r.id DESC`, source, sourceIDs)
	if err != nil {
		return nil, fmt.Errorf("accrued usage: %w", err)
	}
	type run struct {
		sourceID, tenantID uuid.UUID
		currency, unit     string
		quantity           int64
		billFrom           time.Time
		billTo             *time.Time
		state              runState
		booked             int64
	}
	var runs []run
	for rows.Next() {
		var r run
		var id uuid.UUID
		if err := rows.Scan(&id, &r.sourceID, &r.tenantID, &r.currency, &r.unit, &r.quantity, &r.billFrom, &r.billTo,
			&r.state.ratedThrough, &r.state.segFrom, &r.state.segUnits, &r.state.segAmount, &r.booked); err != nil {
			rows.Close()
			return nil, fmt.Errorf("accrued usage: %w", err)
		}
		runs = append(runs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("accrued usage: %w", err)
	}
	pr := newPricer(s.read(ctx))
	at := now.UTC().Truncate(time.Millisecond)
	for _, r := range runs {
		m, seen := out[r.sourceID]
		if !seen {
			m = Money{Currency: r.currency} // the latest run comes first
		} else if m.Currency != r.currency {
			continue
		}
		m.AmountMinor += r.booked
		end := at
		if r.billTo != nil && r.billTo.Before(end) {
			end = *r.billTo
		}
		if end.After(r.state.ratedThrough) {
			sc, err := pr.forTenant(ctx, r.tenantID)
			if errors.Is(err, ErrNoPrice) {
				out[r.sourceID] = m
				continue
			}
			if err != nil {
				return nil, err
			}
			pieces, _, err := ratePieces(r.billFrom, r.quantity, exponents[r.currency], r.state, end, sc.priceAt(r.unit, r.currency))
			if err != nil && !errors.Is(err, ErrNoPrice) {
				return nil, err
			}
			for _, p := range pieces {
				m.AmountMinor += p.amount
			}
		}
		out[r.sourceID] = m
	}
	return out, nil
}

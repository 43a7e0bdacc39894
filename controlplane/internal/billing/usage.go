package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// Usage sources.
const (
	SourceAllocation = "allocation"
	SourceAppRuntime = "app_runtime"
)

// UsageStart opens a usage record: one uninterrupted run of metered usage.
type UsageStart struct {
	Source    string    // SourceAllocation or SourceAppRuntime
	SourceID  uuid.UUID // e.g. the allocation id; one open run per source id
	TenantID  uuid.UUID
	ProjectID uuid.UUID // uuid.Nil when none
	UserID    uuid.UUID // who requested the workload
	Unit      string    // priced usage unit, e.g. "gpu.h100"
	Quantity  int64     // units metered concurrently (e.g. GPUs), 1..1,000,000
	Currency  string    // wallet currency; "" means the tenant's default currency
	StartedAt time.Time
}

// UsageRecord is a stored run.
type UsageRecord = billingdb.BillingUsageRecord

// RateResult says what one rating did.
type RateResult struct {
	RecordID  uuid.UUID
	RatingKey string
	Through   time.Time
	Lines     int
	Amount    int64 // minor units booked by this rating (0 on a replay)
	Uncovered int64 // part of the paid amount the wallet could not cover (booked as receivable)
	// Wholesale is the wholesale amount rated for the reseller of an end customer (in
	// WholesaleLines lines); with reseller credit risk it is what was paid, not Amount.
	Wholesale      int64
	WholesaleLines int
	LedgerTxn      uuid.UUID
	Replayed       bool
	QuantityMs     int64 // cumulative metered quantity rated
}

// StartUsage opens a run. It is idempotent per open (Source, SourceID): starting a run
// that is already open returns it. The unit must have a price in the tenant's plan.
// tx may be nil (its own transaction) or the caller's (e.g. the allocation's).
func (s *Service) StartUsage(ctx context.Context, tx pgx.Tx, u UsageStart) (UsageRecord, error) {
	if u.Source != SourceAllocation && u.Source != SourceAppRuntime {
		return UsageRecord{}, apierr.Validation("usage_source", "unknown usage source %q", u.Source)
	}
	if !unitPattern.MatchString(u.Unit) {
		return UsageRecord{}, apierr.Validation("usage_unit", "usage_unit must match %s", unitPattern)
	}
	if u.Quantity < 1 || u.Quantity > 1_000_000 {
		return UsageRecord{}, apierr.Validation("quantity", "quantity must be 1..1000000")
	}
	var out UsageRecord
	err := s.inTx(ctx, tx, func(tx pgx.Tx) error {
		q := billingdb.New(tx)
		cur := u.Currency
		if cur == "" {
			def, err := q.TenantDefaultCurrency(ctx, u.TenantID)
			if err != nil {
				return fmt.Errorf("tenant currency: %w", err)
			}
			cur = def
		}
		if err := checkCurrency("currency", cur); err != nil {
			return err
		}
		sc, err := newPricer(q).forTenant(ctx, u.TenantID)
		if err != nil {
			return err
		}
		if _, _, err := sc.priceAt(u.Unit, cur)(u.StartedAt); err != nil {
			return err
		}
		start := u.StartedAt.UTC().Truncate(time.Millisecond)
		out, err = q.InsertUsageRecord(ctx, billingdb.InsertUsageRecordParams{
			ID: s.IDs.New(), TenantID: u.TenantID, ProjectID: nullUUID(u.ProjectID), RequestedByUserID: u.UserID,
			Source: u.Source, SourceID: u.SourceID, UsageUnit: u.Unit, Quantity: u.Quantity, Currency: cur,
			BillFrom: start, CreatedAt: s.Clock.Now(),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			out, err = q.OpenUsageBySource(ctx, billingdb.OpenUsageBySourceParams{Source: u.Source, SourceID: u.SourceID})
		}
		if err != nil {
			return fmt.Errorf("usage record: %w", err)
		}
		return nil
	})
	return out, err
}

func (s *Service) inTx(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	if tx != nil {
		return fn(tx)
	}
	return db.InTx(ctx, s.Pool, fn)
}

// StopUsage ends the open run of (source, sourceID) at endedAt and rates it to the end
// (rating key "<record id>:final"). Stopping a run that is not open is a no-op returning
// a zero result. tx may be nil or the caller's.
func (s *Service) StopUsage(ctx context.Context, tx pgx.Tx, source string, sourceID uuid.UUID, endedAt time.Time) (RateResult, error) {
	var res RateResult
	err := s.inTx(ctx, tx, func(tx pgx.Tx) error {
		q := billingdb.New(tx)
		rec, err := q.OpenUsageBySource(ctx, billingdb.OpenUsageBySourceParams{Source: source, SourceID: sourceID})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open usage: %w", err)
		}
		end := endedAt.UTC().Truncate(time.Millisecond)
		if end.Before(rec.RatedThrough) {
			end = rec.RatedThrough // already rated further (clock skew): never un-rate
		}
		if _, err := q.CloseUsageRecord(ctx, billingdb.CloseUsageRecordParams{BillTo: &end, Now: s.Clock.Now(), ID: rec.ID}); err != nil {
			return fmt.Errorf("close usage: %w", err)
		}
		out, err := s.rateBatch(ctx, tx, []rateJob{{recordID: rec.ID, through: end, key: rec.ID.String() + ":final"}}, true)
		if err != nil {
			return err
		}
		res = out[0]
		return nil
	})
	return res, err
}

// RateUsage rates a record's cumulative usage through `through` (clamped to the run's
// end) under ratingKey, booking the difference to what is already rated. A repeated key
// with the same cumulative quantity is a replay (no new line); with a different quantity
// it is a conflict (409 invalid_request, reason rating_key_conflict).
func (s *Service) RateUsage(ctx context.Context, recordID uuid.UUID, through time.Time, ratingKey string) (RateResult, error) {
	if n := len(ratingKey); n < 1 || n > 200 {
		return RateResult{}, apierr.Validation("rating_key", "rating_key has 1 to 200 characters")
	}
	var res RateResult
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		out, err := s.rateBatch(ctx, tx, []rateJob{{recordID: recordID, through: through, key: ratingKey}}, true)
		if err != nil {
			return err
		}
		res = out[0]
		return nil
	})
	return res, err
}

// RateStats sums a RateRunning pass.
type RateStats struct {
	Records int
	Lines   int
	Amount  int64
	Failed  int
}

// RateRunning rates every open run (and every closed run not yet rated to its end)
// through now, batchSize runs per transaction, with rating keys "<record id>@<unix ms>".
// A run that cannot be rated (no price) is counted in Failed and left for the next pass.
func (s *Service) RateRunning(ctx context.Context, now time.Time, batchSize int) (RateStats, error) {
	if batchSize <= 0 {
		batchSize = 500
	}
	var st RateStats
	var after uuid.NullUUID
	through := now.UTC().Truncate(time.Millisecond)
	for {
		ids, err := s.read(ctx).UnratedRecordIDs(ctx, billingdb.UnratedRecordIDsParams{After: after, Limit: int32(batchSize)})
		if err != nil {
			return st, fmt.Errorf("unrated usage: %w", err)
		}
		if len(ids) == 0 {
			return st, nil
		}
		after = uuid.NullUUID{UUID: ids[len(ids)-1], Valid: true}
		jobs := make([]rateJob, len(ids))
		for i, id := range ids {
			jobs[i] = rateJob{recordID: id, through: through, key: id.String() + "@" + strconv.FormatInt(through.UnixMilli(), 10)}
		}
		err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
			out, err := s.rateBatch(ctx, tx, jobs, false)
			for _, r := range out {
				if r.RecordID == uuid.Nil {
					st.Failed++
					continue
				}
				st.Records++
				st.Lines += r.Lines
				st.Amount += r.Amount
			}
			return err
		})
		if err != nil {
			return st, err
		}
		if len(ids) < batchSize {
			return st, nil
		}
	}
}

type rateJob struct {
	recordID uuid.UUID
	through  time.Time
	key      string
}

// rateBatch rates jobs in tx: lock the runs, recognise replays, compute the lines, cover
// them from the wallets (locked in id order; what a wallet cannot cover is booked to the
// tenant's receivable), and write events, ledger transactions, entries, projections,
// lines and run states in a few statements. strict makes a job's failure the batch's
// error; otherwise a failed job is skipped (its result has a nil RecordID).
func (s *Service) rateBatch(ctx context.Context, tx pgx.Tx, jobs []rateJob, strict bool) ([]RateResult, error) {
	q := billingdb.New(tx)
	now := s.Clock.Now()
	idsToLock := make([]uuid.UUID, len(jobs))
	ratingKeys := make([]string, len(jobs))
	for i, j := range jobs {
		idsToLock[i], ratingKeys[i] = j.recordID, j.key
	}
	recs, err := q.LockUsageRecords(ctx, idsToLock)
	if err != nil {
		return nil, fmt.Errorf("lock usage: %w", err)
	}
	byID := make(map[uuid.UUID]*billingdb.BillingUsageRecord, len(recs))
	for i := range recs {
		byID[recs[i].ID] = &recs[i]
	}
	resales, err := loadResales(ctx, tx, recs)
	if err != nil {
		return nil, err
	}
	events, err := q.RatingEvents(ctx, ratingKeys)
	if err != nil {
		return nil, fmt.Errorf("rating events: %w", err)
	}
	prior := make(map[string]billingdb.BillingRatingEvent, len(events))
	for _, e := range events {
		prior[e.RatingKey] = e
	}

	type computed struct {
		job    int
		rec    *billingdb.BillingUsageRecord
		pieces []ratedPiece
		state  runState
		qty    int64
		total  int64
		rs     *resale // the wholesale side of an end customer's usage
	}
	results := make([]RateResult, len(jobs))
	var work []computed
	pr := newPricer(q)
	fail := func(i int, err error) error {
		if strict {
			return err
		}
		results[i] = RateResult{}
		return nil
	}
	for i, j := range jobs {
		rec := byID[j.recordID]
		if rec == nil {
			if err := fail(i, apierr.New(apierr.InvalidRequest, "usage record not found").WithStatus(404).With("reason", "not_found")); err != nil {
				return nil, err
			}
			continue
		}
		through := j.through.UTC().Truncate(time.Millisecond)
		if rec.BillTo != nil && through.After(*rec.BillTo) {
			through = *rec.BillTo
		}
		if through.Before(rec.BillFrom) {
			through = rec.BillFrom
		}
		qty := through.Sub(rec.BillFrom).Milliseconds() * rec.Quantity
		if e, ok := prior[j.key]; ok {
			if e.UsageRecordID != rec.ID || e.CumulativeQuantityMillis != qty {
				if err := fail(i, apierr.New(apierr.InvalidRequest, "rating key was used with a different quantity").WithStatus(409).
					With("reason", "rating_key_conflict").With("rating_key", j.key)); err != nil {
					return nil, err
				}
				continue
			}
			results[i] = RateResult{RecordID: rec.ID, RatingKey: j.key, Through: e.Through, Replayed: true,
				LedgerTxn: e.LedgerTxnID.UUID, QuantityMs: qty}
			continue
		}
		if through.Before(rec.RatedThrough) {
			through = rec.RatedThrough
			qty = through.Sub(rec.BillFrom).Milliseconds() * rec.Quantity
		}
		exp := exponents[rec.Currency]
		sc, err := pr.forTenant(ctx, rec.TenantID)
		if err != nil {
			if err := fail(i, err); err != nil {
				return nil, err
			}
			continue
		}
		st := runState{ratedThrough: rec.RatedThrough, segFrom: rec.SegFrom, segUnits: rec.SegUnits, segAmount: rec.SegAmountMinor}
		pieces, st, err := ratePieces(rec.BillFrom, rec.Quantity, exp, st, through, sc.priceAt(rec.UsageUnit, rec.Currency))
		if err != nil {
			if err := fail(i, err); err != nil {
				return nil, err
			}
			continue
		}
		c := computed{job: i, rec: rec, pieces: pieces, state: st, qty: qty}
		for _, p := range pieces {
			c.total += p.amount
		}
		if rs, ok := resales[rec.ID]; ok {
			wsc, err := pr.forPlanOrDefault(ctx, rs.plan)
			if err == nil {
				rs.pieces, rs.st, err = ratePieces(rec.BillFrom, rec.Quantity, exp, rs.st, st.ratedThrough, wsc.priceAt(rec.UsageUnit, rec.Currency))
			}
			if err != nil {
				if err := fail(i, err); err != nil {
					return nil, err
				}
				continue
			}
			rs.total = 0
			for _, p := range rs.pieces {
				rs.total += p.amount
			}
			c.rs = rs
		}
		work = append(work, c)
		results[i] = RateResult{RecordID: rec.ID, RatingKey: j.key, Through: through, Lines: len(pieces), Amount: c.total, QuantityMs: qty}
	}
	if len(work) == 0 {
		return results, nil
	}

	// Wallets: resolve and lock in id order, then cover each run's amount in job order.
	// The paying side: the tenant's own usage, or for an end customer the credit risk
	// owner's (the reseller pays the wholesale amount; the platform's risk has the end
	// customer pay the customer amount).
	payer := func(c computed) (uuid.UUID, int64, bool) {
		if c.rs != nil && c.rs.owner == RiskReseller {
			return c.rs.reseller, c.rs.total, true
		}
		return c.rec.TenantID, c.total, false
	}
	var keys []AccountKey
	for _, c := range work {
		who, amount, _ := payer(c)
		if amount == 0 {
			continue
		}
		keys = append(keys,
			AccountKey{Kind: AccountWallet, TenantID: who, Currency: c.rec.Currency},
			AccountKey{Kind: AccountReceivable, TenantID: who, Currency: c.rec.Currency},
			AccountKey{Kind: AccountRevenue, Currency: c.rec.Currency})
	}
	walletOf, err := s.Ledger.accountIDs(ctx, q, keys)
	if err != nil {
		return nil, err
	}
	var lockIDs []uuid.UUID
	for k, id := range walletOf {
		if k.Kind == AccountWallet {
			lockIDs = append(lockIDs, id)
		}
	}
	slices.SortFunc(lockIDs, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	balance := map[uuid.UUID]int64{}
	if len(lockIDs) > 0 {
		locked, err := q.LockAccounts(ctx, lockIDs)
		if err != nil {
			return nil, fmt.Errorf("lock wallets: %w", err)
		}
		for _, a := range locked {
			balance[a.ID] = a.BalanceMinor.Int64
		}
	}

	corr := correlation.ID(ctx)
	txns := billingdb.InsertTxnsParams{Kind: TxnUsage, CorrelationID: corr, CreatedAt: now}
	entries := billingdb.InsertEntriesParams{CreatedAt: now}
	deltas := map[uuid.UUID]int64{}
	evs := billingdb.InsertRatingEventsParams{CreatedAt: now}
	upd := billingdb.UpdateRatedRecordsParams{Now: now}
	var lines, wsLines []billingdb.CopyRatedLinesParams
	var wsState wholesaleState
	addEntry := func(txn, account uuid.UUID, currency string, amount int64) uuid.UUID {
		id := s.IDs.New()
		entries.Ids = append(entries.Ids, id)
		entries.TxnIds = append(entries.TxnIds, txn)
		entries.AccountIds = append(entries.AccountIds, account)
		entries.Currencies = append(entries.Currencies, currency)
		entries.Amounts = append(entries.Amounts, amount)
		return id
	}
	for _, c := range work {
		rec, j := c.rec, jobs[c.job]
		var txnID uuid.UUID
		var lineEntries, wsEntries []uuid.UUID
		who, payTotal, wholesalePays := payer(c)
		if payTotal > 0 {
			txnID = s.IDs.New()
			txns.Ids = append(txns.Ids, txnID)
			txns.TenantIds = append(txns.TenantIds, who)
			txns.Refs = append(txns.Refs, "rating:"+j.key)
			wallet := walletOf[AccountKey{Kind: AccountWallet, TenantID: who, Currency: rec.Currency}]
			recv := walletOf[AccountKey{Kind: AccountReceivable, TenantID: who, Currency: rec.Currency}]
			revenue := walletOf[AccountKey{Kind: AccountRevenue, Currency: rec.Currency}]
			covered := min(payTotal, balance[wallet])
			balance[wallet] -= covered
			if covered > 0 {
				addEntry(txnID, wallet, rec.Currency, -covered)
				deltas[wallet] -= covered
			}
			if rest := payTotal - covered; rest > 0 {
				addEntry(txnID, recv, rec.Currency, -rest)
				deltas[recv] -= rest
				results[c.job].Uncovered = rest
			}
			paid := c.pieces
			if wholesalePays {
				paid = c.rs.pieces
			}
			var es []uuid.UUID
			for _, p := range paid {
				var e uuid.UUID
				if p.amount != 0 {
					e = addEntry(txnID, revenue, rec.Currency, p.amount)
				}
				es = append(es, e)
			}
			if wholesalePays {
				wsEntries = es
			} else {
				lineEntries = es
			}
			results[c.job].LedgerTxn = txnID
		}
		if c.rs != nil {
			results[c.job].Wholesale, results[c.job].WholesaleLines = c.rs.total, len(c.rs.pieces)
			for n, p := range c.rs.pieces {
				var entryID uuid.UUID
				if wsEntries != nil {
					entryID = wsEntries[n]
				}
				version := strconv.Itoa(int(p.price.version))
				snap, _ := json.Marshal(map[string]any{
					"rating_role": "wholesale", "plan_id": p.price.planID.String(), "plan_name": p.price.planName,
					"plan_version": p.price.version, "version_effective_from": p.price.effectiveFrom, "usage_unit": rec.UsageUnit,
					"currency": rec.Currency, "unit_price": p.price.priceText, "quantity": rec.Quantity, "amount_exact": p.exact.Text('f'),
					"segment_from": p.segFrom, "cumulative_units": p.cumUnits, "cumulative_amount_minor": p.cumAmount,
					"credit_risk_owner": c.rs.owner,
				})
				wsLines = append(wsLines, billingdb.CopyRatedLinesParams{
					ID: s.IDs.New(), UsageRecordID: rec.ID, TenantID: c.rs.reseller, RequestedByUserID: uuid.Nil,
					UsageSource: rec.Source, UsageUnit: rec.UsageUnit, SegmentFrom: p.segFrom, BillFrom: p.from, BillTo: p.to,
					UnitQuantityMillis: p.quantityMillis, Units: p.units, CumulativeUnits: p.cumUnits, Currency: rec.Currency,
					UnitPrice: p.price.priceText, AmountMinor: p.amount, AmountExact: p.exact.Text('f'), CumulativeAmountMinor: p.cumAmount,
					PricingSource: "wholesale_plan", PricingPlanID: nullUUID(p.price.planID), PricingPlanVersion: &version,
					PricingSnapshot: snap, RatingEventKey: j.key, RatingKey: j.key + "/wholesale/" + strconv.Itoa(n),
					LedgerEntryID: nullUUID(entryID), CreatedAt: now,
				})
			}
			wsState.add(rec.ID, c.rs.st)
		}
		evs.Keys = append(evs.Keys, j.key)
		evs.RecordIds = append(evs.RecordIds, rec.ID)
		evs.Throughs = append(evs.Throughs, c.state.ratedThrough)
		evs.Quantities = append(evs.Quantities, c.qty)
		evs.TxnIds = append(evs.TxnIds, txnID)
		for n, p := range c.pieces {
			var entryID uuid.UUID
			if lineEntries != nil {
				entryID = lineEntries[n]
			}
			version := strconv.Itoa(int(p.price.version))
			snap, _ := json.Marshal(map[string]any{
				"plan_id": p.price.planID.String(), "plan_name": p.price.planName, "plan_version": p.price.version,
				"version_effective_from": p.price.effectiveFrom, "usage_unit": rec.UsageUnit, "currency": rec.Currency,
				"unit_price": p.price.priceText, "quantity": rec.Quantity, "amount_exact": p.exact.Text('f'),
				"segment_from": p.segFrom, "cumulative_units": p.cumUnits, "cumulative_amount_minor": p.cumAmount,
				"rounding": "per line, half away from zero; run rounded up to whole seconds",
			})
			lines = append(lines, billingdb.CopyRatedLinesParams{
				ID: s.IDs.New(), UsageRecordID: rec.ID, TenantID: rec.TenantID, ProjectID: rec.ProjectID,
				RequestedByUserID: rec.RequestedByUserID, UsageSource: rec.Source, UsageUnit: rec.UsageUnit,
				SegmentFrom: p.segFrom, BillFrom: p.from, BillTo: p.to, UnitQuantityMillis: p.quantityMillis,
				Units: p.units, CumulativeUnits: p.cumUnits, Currency: rec.Currency, UnitPrice: p.price.priceText,
				AmountMinor: p.amount, AmountExact: p.exact.Text('f'), CumulativeAmountMinor: p.cumAmount,
				PricingSource: "pricing_plan", PricingPlanID: nullUUID(p.price.planID), PricingPlanVersion: &version,
				PricingSnapshot: snap, RatingEventKey: j.key, RatingKey: j.key + "/" + strconv.Itoa(n),
				LedgerEntryID: nullUUID(entryID), CreatedAt: now,
			})
		}
		upd.Ids = append(upd.Ids, rec.ID)
		upd.RatedThroughs = append(upd.RatedThroughs, c.state.ratedThrough)
		upd.RatedQuantities = append(upd.RatedQuantities, c.qty)
		upd.SegFroms = append(upd.SegFroms, c.state.segFrom)
		upd.SegUnits = append(upd.SegUnits, c.state.segUnits)
		upd.SegAmounts = append(upd.SegAmounts, c.state.segAmount)
	}
	if len(txns.Ids) > 0 {
		if err := q.InsertTxns(ctx, txns); err != nil {
			return nil, fmt.Errorf("usage transactions: %w", err)
		}
		if err := q.InsertEntries(ctx, entries); err != nil {
			return nil, fmt.Errorf("usage entries: %w", err)
		}
		ap := billingdb.ApplyToAccountsParams{Now: now}
		for id, d := range deltas {
			ap.Ids = append(ap.Ids, id)
			ap.Deltas = append(ap.Deltas, d)
		}
		n, err := q.ApplyToAccounts(ctx, ap)
		if err != nil {
			return nil, fmt.Errorf("usage projections: %w", err)
		}
		if n != int64(len(ap.Ids)) {
			return nil, fmt.Errorf("usage projections: %d of %d accounts moved", n, len(ap.Ids))
		}
	}
	if err := q.InsertRatingEvents(ctx, evs); err != nil {
		return nil, fmt.Errorf("rating events: %w", err)
	}
	if len(lines) > 0 {
		if _, err := q.CopyRatedLines(ctx, lines); err != nil {
			return nil, fmt.Errorf("rated lines: %w", err)
		}
	}
	if err := copyWholesaleLines(ctx, tx, wsLines); err != nil {
		return nil, err
	}
	if err := q.UpdateRatedRecords(ctx, upd); err != nil {
		return nil, fmt.Errorf("usage state: %w", err)
	}
	if err := wsState.write(ctx, tx); err != nil {
		return nil, err
	}
	return results, nil
}

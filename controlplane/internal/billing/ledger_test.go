package billing

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestCurrencyTableMatchesCode(t *testing.T) {
	f := newFixture(t)
	rows, err := billingdb.New(f.pool).ListCurrencies(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(exponents) {
		t.Fatalf("%d currencies in the database, %d in code", len(rows), len(exponents))
	}
	for _, r := range rows {
		if e, ok := exponents[r.Code]; !ok || e != int(r.Exponent) {
			t.Fatalf("%s: database %d, code %d (%v)", r.Code, r.Exponent, e, ok)
		}
	}
	for cur, want := range map[string]int{"USD": 2, "EUR": 2, "GBP": 2, "JPY": 0, "KWD": 3, "CHF": 2} {
		if got, _ := Exponent(cur); got != want {
			t.Fatalf("%s exponent %d", cur, got)
		}
	}
}

func TestParseAmountRefusesOtherPrecision(t *testing.T) {
	for _, c := range []struct {
		cur, in string
		want    int64
		reason  string
	}{
		{"USD", "12.34", 1234, ""}, {"USD", "12.3", 1230, ""}, {"USD", "12", 1200, ""},
		{"USD", "12.345", 0, "precision"}, {"USD", "12.340", 0, "precision"},
		{"JPY", "1500", 1500, ""}, {"JPY", "1.5", 0, "precision"}, {"JPY", "1.0", 0, "precision"},
		{"KWD", "1.234", 1234, ""}, {"KWD", "1.2345", 0, "precision"},
		{"USD", "abc", 0, "malformed_amount"}, {"XXX", "1", 0, "unsupported_currency"},
	} {
		got, err := ParseAmount("amount", c.cur, c.in)
		if c.reason == "" {
			if err != nil || got != c.want {
				t.Fatalf("%s %s: %d %v", c.in, c.cur, got, err)
			}
			continue
		}
		e, ok := apierr.As(err)
		if !ok || e.Code != apierr.ValidationError || e.Details["reason"] != c.reason {
			t.Fatalf("%s %s: want %s, got %v", c.in, c.cur, c.reason, err)
		}
	}
}

func TestPostRefusesUnbalancedInCodeAndDatabase(t *testing.T) {
	f := newFixture(t)
	tenant, _ := f.tenant("USD")
	err := db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.svc.Ledger.Post(f.ctx, tx, Posting{Kind: TxnAdjustment, TenantID: tenant, Reference: "x",
			Legs: []Leg{
				{Account: AccountKey{Kind: AccountWallet, TenantID: tenant, Currency: "USD"}, Amount: 100},
				{Account: AccountKey{Kind: AccountAdjustments, Currency: "USD"}, Amount: -99},
			}})
		return err
	})
	if !errors.Is(err, ErrUnbalanced) {
		t.Fatalf("code: %v", err)
	}
	// Two currencies that each sum to zero are fine; one leg per currency is not.
	err = validateLegs([]Leg{
		{Account: AccountKey{Kind: AccountFX, Currency: "USD"}, Amount: 5},
		{Account: AccountKey{Kind: AccountFX, Currency: "EUR"}, Amount: -5},
	})
	if !errors.Is(err, ErrUnbalanced) {
		t.Fatalf("cross-currency: %v", err)
	}
	// The database refuses an unbalanced transaction at commit, whoever writes it.
	f.topUp(tenant, "USD", 100)
	acct, err := f.svc.Ledger.accountID(f.ctx, billingdb.New(f.pool), AccountKey{Kind: AccountAdjustments, Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		q := billingdb.New(tx)
		id := uuid.New()
		if _, err := q.InsertTxn(f.ctx, billingdb.InsertTxnParams{ID: id, Kind: TxnAdjustment, Reference: "raw", CreatedAt: t0}); err != nil {
			return err
		}
		return q.InsertEntries(f.ctx, billingdb.InsertEntriesParams{Ids: []uuid.UUID{uuid.New()}, TxnIds: []uuid.UUID{id},
			AccountIds: []uuid.UUID{acct}, Currencies: []string{"USD"}, Amounts: []int64{7}, CreatedAt: t0})
	})
	// Refused by the balance trigger itself (check_violation), not by any other error
	// (an unknown account would be a foreign-key violation and prove nothing).
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "23514" ||
		!strings.Contains(pgErr.Message, "does not sum to zero") {
		t.Fatalf("unbalanced transaction: %v, want SQLSTATE 23514 from billing_ledger_txn_balanced", err)
	}
	f.checkInvariants()
}

func TestEntriesAreImmutable(t *testing.T) {
	f := newFixture(t)
	tenant, _ := f.tenant("USD")
	f.topUp(tenant, "USD", 500)
	for _, q := range []string{
		`UPDATE billing_ledger_entries SET amount_minor = amount_minor + 1`,
		`DELETE FROM billing_ledger_entries`,
		`UPDATE billing_ledger_transactions SET memo = 'x'`,
		`DELETE FROM billing_ledger_transactions`,
		`TRUNCATE billing_ledger_entries CASCADE`,
	} {
		// Refused with insufficient_privilege (42501): by the append-only trigger, or by
		// the revoked privilege where the tests run as the application's role.
		_, err := f.pool.Exec(f.ctx, q)
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("%s: %v, want SQLSTATE 42501", q, err)
		}
	}
	f.checkInvariants()
}

func TestTopUpIdempotentRefundBounded(t *testing.T) {
	f := newFixture(t)
	tenant, _ := f.tenant("USD")
	payment := uuid.New()
	var first, second uuid.UUID
	for _, out := range []*uuid.UUID{&first, &second} {
		err := db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
			var err error
			*out, err = f.svc.Ledger.CreditTopUp(f.ctx, tx, tenant, "USD", 2500, payment)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if first != second || f.wallet(tenant, "USD") != 2500 {
		t.Fatalf("replay: %s %s balance %d", first, second, f.wallet(tenant, "USD"))
	}
	err := db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.svc.Ledger.DebitRefund(f.ctx, tx, tenant, "USD", 2501, uuid.New())
		return err
	})
	wantCode(t, err, apierr.InsufficientBalance, "")
	refund := uuid.New()
	for range 2 {
		err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
			_, err := f.svc.Ledger.DebitRefund(f.ctx, tx, tenant, "USD", 1000, refund)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.wallet(tenant, "USD") != 1500 {
		t.Fatalf("after refund: %d", f.wallet(tenant, "USD"))
	}
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.svc.Ledger.CreditTopUp(f.ctx, tx, tenant, "USD", 0, uuid.New())
		return err
	})
	wantCode(t, err, apierr.ValidationError, "not_positive")
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.svc.Ledger.CreditTopUp(f.ctx, tx, tenant, "XYZ", 10, uuid.New())
		return err
	})
	wantCode(t, err, apierr.ValidationError, "unsupported_currency")
	f.checkInvariants()
}

// K concurrent debits of a against B succeed at most floor(B/a) times; the rest fail
// cleanly with insufficient_balance and leave nothing behind.
func TestConcurrentDebitsNeverOverdraw(t *testing.T) {
	f := newFixture(t)
	tenant, _ := f.tenant("USD")
	const B, a, K = 1000, 70, 40
	f.topUp(tenant, "USD", B)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range K {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
				_, err := f.svc.Ledger.DebitRefund(f.ctx, tx, tenant, "USD", a, uuid.New())
				return err
			})
			switch e, _ := apierr.As(err); {
			case err == nil:
				ok.Add(1)
			case e != nil && e.Code == apierr.InsufficientBalance:
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() > B/a || ok.Load()+refused.Load() != K {
		t.Fatalf("%d succeeded (max %d), %d refused", ok.Load(), B/a, refused.Load())
	}
	if got := f.wallet(tenant, "USD"); got != B-a*ok.Load() {
		t.Fatalf("balance %d after %d debits", got, ok.Load())
	}
	var txns int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM billing_ledger_transactions WHERE kind = 'refund'`).Scan(&txns); err != nil {
		t.Fatal(err)
	}
	if int64(txns) != ok.Load() {
		t.Fatalf("%d refund transactions for %d successes", txns, ok.Load())
	}
	f.checkInvariants()
}

// Sixteen writers post random credits, debits, conversions and reversals on a few
// tenants' USD and EUR wallets; afterwards the ledger invariants hold.
func TestLedgerInvariantsUnderRandomConcurrentWorkload(t *testing.T) {
	f := newFixture(t)
	var tenants []uuid.UUID
	for range 3 {
		id, _ := f.tenant("USD")
		tenants = append(tenants, id)
		f.topUp(id, "USD", 50_000)
		f.topUp(id, "EUR", 20_000)
	}
	usdEur, _, err := f.svc.RecordFXSnapshot(f.ctx, FXInput{Source: "USD", Target: "EUR", Rate: "0.9137", Provider: "test", CapturedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	eurUsd, _, err := f.svc.RecordFXSnapshot(f.ctx, FXInput{Source: "EUR", Target: "USD", Rate: "1.0921", Provider: "test", CapturedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var posted []uuid.UUID
	var wg sync.WaitGroup
	var okOps, refusedOps atomic.Int64
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 42))
			for range 25 {
				tenant := tenants[r.IntN(len(tenants))]
				cur := []string{"USD", "EUR"}[r.IntN(2)]
				amount := int64(1 + r.IntN(3000))
				err := db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
					var id uuid.UUID
					var err error
					switch r.IntN(4) {
					case 0:
						id, err = f.svc.Ledger.CreditTopUp(f.ctx, tx, tenant, cur, amount, uuid.New())
					case 1:
						id, err = f.svc.Ledger.DebitRefund(f.ctx, tx, tenant, cur, amount, uuid.New())
					case 2:
						snap, to := usdEur.ID, "EUR"
						if cur == "EUR" {
							snap, to = eurUsd.ID, "USD"
						}
						var p Posted
						p, _, err = f.svc.Ledger.Convert(f.ctx, tx, Conversion{TenantID: tenant, From: cur, To: to, AmountMinor: amount, SnapshotID: snap})
						id = p.TxnID
					default:
						mu.Lock()
						if len(posted) == 0 {
							mu.Unlock()
							return nil
						}
						target := posted[r.IntN(len(posted))]
						mu.Unlock()
						var p Posted
						p, err = f.svc.Ledger.Reverse(f.ctx, tx, target, "test", uuid.Nil)
						id = p.TxnID
					}
					if err == nil {
						mu.Lock()
						posted = append(posted, id)
						mu.Unlock()
					}
					return err
				})
				if e, ok := apierr.As(err); err == nil {
					okOps.Add(1)
				} else if ok && (e.Code == apierr.InsufficientBalance || e.Code == apierr.InvalidRequest) {
					refusedOps.Add(1) // overdraft, or reversing a reversal
				} else {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if okOps.Load() == 0 {
		t.Fatal("nothing posted")
	}
	f.checkInvariants()
	var conversions, withSnapshot int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*), count(fx_snapshot_id) FROM billing_ledger_transactions WHERE kind = 'conversion'`).Scan(&conversions, &withSnapshot); err != nil {
		t.Fatal(err)
	}
	if conversions != withSnapshot {
		t.Fatalf("%d conversions, %d reference a snapshot", conversions, withSnapshot)
	}
	t.Logf("%d postings, %d refused", okOps.Load(), refusedOps.Load())
}

func TestReversalLinkedOnceAndBounded(t *testing.T) {
	f := newFixture(t)
	tenant, _ := f.tenant("USD")
	top := f.topUp(tenant, "USD", 900)
	rev, err := f.svc.ReverseTransaction(f.ctx, top, "duplicate charge", uuid.Nil)
	if err != nil || f.wallet(tenant, "USD") != 0 {
		t.Fatalf("reverse: %v %d", err, f.wallet(tenant, "USD"))
	}
	again, err := f.svc.ReverseTransaction(f.ctx, top, "again", uuid.Nil)
	if err != nil || !again.Replayed || again.TxnID != rev.TxnID {
		t.Fatalf("second reversal: %+v %v", again, err)
	}
	_, err = f.svc.ReverseTransaction(f.ctx, rev.TxnID, "undo", uuid.Nil)
	wantCode(t, err, apierr.InvalidRequest, "is_reversal")
	// A top-up already spent cannot be reversed below zero.
	top2 := f.topUp(tenant, "USD", 300)
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.svc.Ledger.DebitRefund(f.ctx, tx, tenant, "USD", 200, uuid.New())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.ReverseTransaction(f.ctx, top2, "chargeback", uuid.Nil)
	wantCode(t, err, apierr.InsufficientBalance, "")
	f.checkInvariants()
}

func TestTwoCurrencyBalances(t *testing.T) {
	f := newFixture(t)
	tenant, _ := f.tenant("EUR")
	f.topUp(tenant, "USD", 50_000)
	f.topUp(tenant, "EUR", 12_345)
	f.topUp(tenant, "JPY", 700)
	b, err := f.svc.Balances(f.ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if b.Primary != (Money{12_345, "EUR"}) {
		t.Fatalf("primary %+v", b.Primary)
	}
	want := []Money{{12_345, "EUR"}, {700, "JPY"}, {50_000, "USD"}}
	if len(b.All) != 3 || b.All[0] != want[0] || b.All[1] != want[1] || b.All[2] != want[2] {
		t.Fatalf("balances %+v", b.All)
	}
	amt, cur, err := f.svc.Balance(f.ctx, tenant)
	if err != nil || amt != 12_345 || cur != "EUR" {
		t.Fatalf("BalanceSource: %d %s %v", amt, cur, err)
	}
	// A tenant with no wallet in its default currency shows zero there, never a sum.
	other, _ := f.tenant("GBP")
	f.topUp(other, "USD", 10)
	b, err = f.svc.Balances(f.ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if b.Primary != (Money{0, "GBP"}) || len(b.All) != 2 || b.All[0] != (Money{0, "GBP"}) {
		t.Fatalf("other: %+v", b)
	}
}

func TestFXSnapshotRefusalsAndConversion(t *testing.T) {
	f := newFixture(t)
	for _, rate := range []string{"0", "0.000", "-1", "-0.5", "abc", "1e5", "1.", ".5", "1..2", "", "1,5"} {
		_, _, err := f.svc.RecordFXSnapshot(f.ctx, FXInput{Source: "USD", Target: "EUR", Rate: rate, Provider: "ecb", CapturedAt: t0})
		if e, ok := apierr.As(err); !ok || e.Code != apierr.ValidationError {
			t.Fatalf("rate %q: %v", rate, err)
		}
	}
	_, _, err := f.svc.RecordFXSnapshot(f.ctx, FXInput{Source: "USD", Target: "USD", Rate: "1", Provider: "ecb", CapturedAt: t0})
	wantCode(t, err, apierr.ValidationError, "same_currency")
	snap, created, err := f.svc.RecordFXSnapshot(f.ctx, FXInput{Source: "USD", Target: "JPY", Rate: "151.237", Provider: "ecb", CapturedAt: t0})
	if err != nil || !created {
		t.Fatal(err)
	}
	same, created, err := f.svc.RecordFXSnapshot(f.ctx, FXInput{Source: "USD", Target: "JPY", Rate: "151.2370", Provider: "ecb", CapturedAt: t0})
	if err != nil || created || same.ID != snap.ID {
		t.Fatalf("same snapshot: %v %v", created, err)
	}
	_, _, err = f.svc.RecordFXSnapshot(f.ctx, FXInput{Source: "USD", Target: "JPY", Rate: "150", Provider: "ecb", CapturedAt: t0})
	wantCode(t, err, apierr.InvalidRequest, "fx_snapshot_conflict")
	if _, err := f.pool.Exec(f.ctx, `UPDATE billing_fx_snapshots SET rate = '1'`); err == nil {
		t.Fatal("snapshot updated")
	}

	tenant, _ := f.tenant("USD")
	f.topUp(tenant, "USD", 10_000)
	var p Posted
	var got int64
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		p, got, err = f.svc.Ledger.Convert(f.ctx, tx, Conversion{TenantID: tenant, From: "USD", To: "JPY", AmountMinor: 1_999, SnapshotID: snap.ID})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// 19.99 USD × 151.237 = 3023.22763 JPY, rounded down to 3023.
	if got != 3023 || f.wallet(tenant, "USD") != 8_001 || f.wallet(tenant, "JPY") != 3023 {
		t.Fatalf("converted %d, wallets %d USD %d JPY", got, f.wallet(tenant, "USD"), f.wallet(tenant, "JPY"))
	}
	txn, _ := billingdb.New(f.pool).GetTxn(f.ctx, p.TxnID)
	if txn.FxSnapshotID.UUID != snap.ID || txn.Kind != TxnConversion {
		t.Fatalf("txn %+v", txn)
	}
	entries, _ := billingdb.New(f.pool).TxnEntries(f.ctx, p.TxnID)
	legs := map[string]int64{}
	for _, e := range entries {
		legs[e.AccountKind+"/"+e.Currency] += e.AmountMinor
	}
	if len(entries) != 4 || legs["tenant_wallet/USD"] != -1999 || legs["fx/USD"] != 1999 || legs["fx/JPY"] != -3023 || legs["tenant_wallet/JPY"] != 3023 {
		t.Fatalf("legs %v", legs)
	}
	// A snapshot of other currencies, or an overdraft, is refused.
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, _, err := f.svc.Ledger.Convert(f.ctx, tx, Conversion{TenantID: tenant, From: "EUR", To: "JPY", AmountMinor: 1, SnapshotID: snap.ID})
		return err
	})
	wantCode(t, err, apierr.ValidationError, "fx_snapshot_mismatch")
	err = db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, _, err := f.svc.Ledger.Convert(f.ctx, tx, Conversion{TenantID: tenant, From: "USD", To: "JPY", AmountMinor: 8_002, SnapshotID: snap.ID})
		return err
	})
	wantCode(t, err, apierr.InsufficientBalance, "")
	f.checkInvariants()
}

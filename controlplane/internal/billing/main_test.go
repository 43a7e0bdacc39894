package billing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type fixture struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	clock *clock.Manual
	svc   *Service
}

var t0 = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	clk := clock.NewManual(t0)
	return &fixture{t: t, ctx: context.Background(), pool: pool, clock: clk,
		svc: New(pool, clk, ids.V7{}, Config{MinRunway: time.Hour, RunwayFloor: 10 * time.Minute})}
}

// tenant inserts a tenant (default currency cur) with a project and returns their ids.
func (f *fixture) tenant(cur string) (uuid.UUID, uuid.UUID) {
	f.t.Helper()
	tid, dept, proj := uuid.New(), uuid.New(), uuid.New()
	slug := "t-" + tid.String()[:8]
	_, err := f.pool.Exec(f.ctx, `
		WITH t AS (INSERT INTO tenants (id, name, slug, kind, default_currency, created_at, updated_at)
		           VALUES ($1, $4, $4, 'organization', $5, now(), now()) RETURNING id),
		     d AS (INSERT INTO departments (id, tenant_id, display_name, slug, created_at, updated_at)
		           SELECT $2, id, 'Default', 'default', now(), now() FROM t RETURNING id, tenant_id)
		INSERT INTO projects (id, tenant_id, department_id, name, slug, created_at, updated_at)
		SELECT $3, tenant_id, id, 'Default', 'default', now(), now() FROM d`, tid, dept, proj, slug, cur)
	if err != nil {
		f.t.Fatal(err)
	}
	return tid, proj
}

func (f *fixture) topUp(tenant uuid.UUID, cur string, amount int64) uuid.UUID {
	f.t.Helper()
	var txn uuid.UUID
	err := db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		txn, err = f.svc.Ledger.CreditTopUp(f.ctx, tx, tenant, cur, amount, uuid.New())
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return txn
}

func (f *fixture) wallet(tenant uuid.UUID, cur string) int64 {
	f.t.Helper()
	n, err := f.svc.WalletBalance(f.ctx, tenant, cur)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// checkInvariants verifies the ledger as a whole: every transaction sums to zero per
// currency, every projection equals the sum of its account's entries, no wallet is
// negative, entries' currencies are their accounts', a reversal mirrors its original.
func (f *fixture) checkInvariants() {
	f.t.Helper()
	var n int
	must := func(name, q string) {
		f.t.Helper()
		if err := f.pool.QueryRow(f.ctx, q).Scan(&n); err != nil {
			f.t.Fatalf("%s: %v", name, err)
		}
		if n != 0 {
			f.t.Fatalf("%s: %d violations", name, n)
		}
	}
	must("transactions sum to zero", `SELECT count(*) FROM (SELECT txn_id, currency FROM billing_ledger_entries
		GROUP BY txn_id, currency HAVING sum(amount_minor) <> 0) x`)
	must("transactions have entries", `SELECT count(*) FROM billing_ledger_transactions t
		WHERE NOT EXISTS (SELECT 1 FROM billing_ledger_entries e WHERE e.txn_id = t.id)`)
	must("projection = sum of entries", `SELECT count(*) FROM billing_ledger_accounts a
		WHERE a.balance_minor IS NOT NULL AND a.balance_minor <> coalesce((SELECT sum(amount_minor) FROM billing_ledger_entries e WHERE e.account_id = a.id), 0)`)
	must("wallets never negative", `SELECT count(*) FROM billing_ledger_accounts WHERE kind = 'tenant_wallet' AND balance_minor < 0`)
	must("entry currency = account currency", `SELECT count(*) FROM billing_ledger_entries e JOIN billing_ledger_accounts a ON a.id = e.account_id
		WHERE a.currency <> e.currency`)
	must("reversals mirror originals", `SELECT count(*) FROM billing_ledger_transactions r
		JOIN billing_ledger_transactions o ON o.id = r.reverses_txn_id
		WHERE (SELECT coalesce(sum(amount_minor), 0) FROM billing_ledger_entries WHERE txn_id = r.id AND amount_minor > 0)
		   <> (SELECT coalesce(sum(-amount_minor), 0) FROM billing_ledger_entries WHERE txn_id = o.id AND amount_minor < 0)`)
}

func wantCode(t *testing.T, err error, code apierr.Code, reason string) {
	t.Helper()
	e, ok := apierr.As(err)
	if !ok || e.Code != code || (reason != "" && fmt.Sprint(e.Details["reason"]) != reason) {
		t.Fatalf("got %v, want %s/%s", err, code, reason)
	}
}

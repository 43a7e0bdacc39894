package invoices_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing/invoices"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// March 2026 is the period under test; the clock starts in it.
var (
	march    = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	april    = time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	may      = time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	midMarch = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
)

// accountsFunc lets a test give each tenant its own tax profile.
type accountsFunc func(tenantID uuid.UUID) (invoices.Account, error)

func (f accountsFunc) InvoiceAccount(_ context.Context, _ pgx.Tx, tenantID uuid.UUID, _ string) (invoices.Account, error) {
	return f(tenantID)
}

type fixture struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool
	clk     *clock.Manual
	billing *billing.Service
	svc     *invoices.Service
	reg     *prometheus.Registry
	// tax is the profile every tenant's account has (not_configured by default).
	tax invoices.TaxProfile
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	clk := clock.NewManual(midMarch)
	f := &fixture{t: t, ctx: context.Background(), pool: pool, clk: clk, reg: prometheus.NewRegistry(),
		tax: invoices.TaxProfile{Treatment: invoices.TreatmentNotConfigured}}
	f.billing = billing.New(pool, clk, ids.V7{}, billing.Config{MinRunway: time.Hour, RunwayFloor: 10 * time.Minute})
	accounts := accountsFunc(func(tenantID uuid.UUID) (invoices.Account, error) {
		return invoices.Account{TenantID: tenantID, SellerKey: invoices.PlatformSeller, SellerName: "Gantry GmbH",
			CustomerName: "Acme " + tenantID.String()[:8], PaymentTermsDays: 14, Tax: f.tax}, nil
	})
	svc, err := invoices.New(pool, clk, ids.V7{}, f.billing.Ledger, accounts, f.reg)
	if err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	eff := midMarch.AddDate(0, -2, 0)
	// One GPU-second costs 0.01 USD (1 minor unit) and 0.02 EUR: amounts are easy to read.
	if _, err := f.billing.CreatePlan(f.ctx, "test", true, &eff, []billing.PriceInput{
		{Unit: "gpu.h100", Currency: "USD", UnitPrice: "0.01"}, {Unit: "gpu.h100", Currency: "EUR", UnitPrice: "0.02"},
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

// tenant inserts a tenant (default currency USD) with a project.
func (f *fixture) tenant() (uuid.UUID, uuid.UUID) {
	f.t.Helper()
	tid, dept, proj := uuid.New(), uuid.New(), uuid.New()
	slug := "t-" + tid.String()[:8]
	_, err := f.pool.Exec(f.ctx, `
		WITH t AS (INSERT INTO tenants (id, name, slug, kind, default_currency, created_at, updated_at)
		           VALUES ($1, $4, $4, 'organization', 'USD', now(), now()) RETURNING id),
		     d AS (INSERT INTO departments (id, tenant_id, display_name, slug, created_at, updated_at)
		           SELECT $2, id, 'Default', 'default', now(), now() FROM t RETURNING id, tenant_id)
		INSERT INTO projects (id, tenant_id, department_id, name, slug, created_at, updated_at)
		SELECT $3, tenant_id, id, 'Default', 'default', now(), now() FROM d`, tid, dept, proj, slug)
	if err != nil {
		f.t.Fatal(err)
	}
	return tid, proj
}

func (f *fixture) topUp(tenant uuid.UUID, cur string, amount int64) {
	f.t.Helper()
	err := db.InTx(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.billing.Ledger.CreditTopUp(f.ctx, tx, tenant, cur, amount, uuid.New())
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// usage meters gpus GPUs from `from` to `to` and rates it (at the clock's now).
func (f *fixture) usage(tenant, project uuid.UUID, cur string, gpus int64, from, to time.Time) {
	f.t.Helper()
	src := uuid.New()
	if _, err := f.billing.StartUsage(f.ctx, nil, billing.UsageStart{Source: billing.SourceAllocation, SourceID: src, TenantID: tenant,
		ProjectID: project, UserID: uuid.New(), Unit: "gpu.h100", Quantity: gpus, Currency: cur, StartedAt: from}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.billing.StopUsage(f.ctx, nil, billing.SourceAllocation, src, to); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) close(tenant uuid.UUID, cur string, start, end time.Time) invoices.Closed {
	f.t.Helper()
	c, err := f.svc.Close(f.ctx, invoices.Period{TenantID: tenant, Currency: cur, Start: start, End: end})
	if err != nil {
		f.t.Fatalf("close: %v", err)
	}
	return c
}

func (f *fixture) get(id uuid.UUID) invoices.Invoice {
	f.t.Helper()
	inv, err := f.svc.Get(f.ctx, uuid.Nil, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return inv
}

func (f *fixture) count(q string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(f.ctx, q, args...).Scan(&n); err != nil {
		f.t.Fatalf("count %q: %v", q, err)
	}
	return n
}

func (f *fixture) wallet(tenant uuid.UUID, cur string) int64 {
	f.t.Helper()
	n, err := f.billing.WalletBalance(f.ctx, tenant, cur)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

func wantErr(t *testing.T, err error, code apierr.Code, status int, reason string) *apierr.Error {
	t.Helper()
	var e *apierr.Error
	if !errors.As(err, &e) || e.Code != code || e.HTTPStatus() != status || (reason != "" && fmt.Sprint(e.Details["reason"]) != reason) {
		t.Fatalf("got %v, want %s %d %s", err, code, status, reason)
	}
	return e
}

func linesOf(inv invoices.Invoice, typ string) []invoices.Line {
	var out []invoices.Line
	for _, l := range inv.Lines {
		if l.Type == typ {
			out = append(out, l)
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

package budgets_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/budgets"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// t0 is mid-March 2026: the monthly period is March, the quarter Q1.
var t0 = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

// fakeSpend is the deterministic SpendSource of these tests: spend per (project or
// tenant, currency), whatever the window. It records every question it is asked.
type fakeSpend struct {
	mu     sync.Mutex
	amount map[string]int64
	asked  []string
}

func spendKey(project *uuid.UUID, currency string) string {
	if project == nil {
		return "tenant/" + currency
	}
	return project.String() + "/" + currency
}

func (f *fakeSpend) set(project *uuid.UUID, currency string, v int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.amount == nil {
		f.amount = map[string]int64{}
	}
	f.amount[spendKey(project, currency)] = v
}

func (f *fakeSpend) Spent(_ context.Context, _ uuid.UUID, project *uuid.UUID, currency string, from, to time.Time) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !from.Before(to) {
		return 0, errors.New("empty window")
	}
	f.asked = append(f.asked, spendKey(project, currency))
	return f.amount[spendKey(project, currency)], nil
}

func (f *fakeSpend) questions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.asked...)
}

type fixture struct {
	t       *testing.T
	pool    *pgxpool.Pool
	clk     *clock.Manual
	spend   *fakeSpend
	tenancy *tenancy.Service
	svc     *budgets.Service
	org     tenancy.Provisioned
	admin   *principal.Principal
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	clk := clock.NewManual(t0)
	ten := tenancy.New(pool, clk, ids.V7{}, func(pw string) (string, error) { return "test$" + pw, nil })
	f := &fixture{t: t, pool: pool, clk: clk, spend: &fakeSpend{}, tenancy: ten}
	f.svc = budgets.New(pool, clk, ids.V7{}, f.spend, ten)
	err := db.InTx(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		f.org, err = ten.Provision(context.Background(), tx, tenancy.ProvisionInput{
			Kind: tenancy.KindOrganization, Name: "Acme",
			Admin: tenancy.NewUser{Username: "alice", Password: "correct horse battery"},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.admin = &principal.Principal{UserID: f.org.Admin.ID, Username: "alice", TenantID: f.org.Tenant.ID, TenantRole: principal.TenantRoleAdmin}
	return f
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		f.t.Fatalf("count %q: %v", query, err)
	}
	return n
}

func (f *fixture) outbox(typ string) int {
	return f.count(`SELECT count(*) FROM outbox_events WHERE event_type = $1`, typ)
}

// create makes a budget as the tenant admin, failing the test on refusal.
func (f *fixture) create(in budgets.NewBudget) budgets.Budget {
	f.t.Helper()
	ps, err := f.svc.Create(context.Background(), f.admin, in)
	if err != nil {
		f.t.Fatalf("create budget: %v", err)
	}
	return ps.Budget
}

func tenantBudget(name, mode string, amount int64, threshold int) budgets.NewBudget {
	return budgets.NewBudget{
		ScopeType: budgets.ScopeTenant, Name: name, Period: budgets.PeriodMonthly,
		Amount: budgets.Money{AmountMinor: amount, Currency: "USD"}, ThresholdPercent: &threshold, EnforcementMode: &mode,
	}
}

// events are the budget's events, oldest first.
func (f *fixture) events(budgetID uuid.UUID) []budgets.Event {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT id, threshold_key, period_start, seen_count, first_seen_at, last_seen_at, status, spent_minor, percent_used
		FROM budget_events WHERE budget_id = $1 ORDER BY first_seen_at, id`, budgetID)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []budgets.Event
	for rows.Next() {
		var e budgets.Event
		if err := rows.Scan(&e.ID, &e.ThresholdKey, &e.PeriodStart, &e.SeenCount, &e.FirstSeenAt, &e.LastSeenAt, &e.Status, &e.SpentMinor, &e.PercentUsed); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *fixture) evaluate() budgets.Evaluation {
	f.t.Helper()
	ev, err := f.svc.Evaluate(context.Background(), f.org.Tenant.ID)
	if err != nil {
		f.t.Fatalf("evaluate: %v", err)
	}
	return ev
}

// outboxPayloads are the payloads of the outbox events of a type.
func (f *fixture) outboxPayloads(typ string) []map[string]any {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT payload FROM outbox_events WHERE event_type = $1 ORDER BY created_at, id`, typ)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			f.t.Fatal(err)
		}
		m := map[string]any{}
		if err := json.Unmarshal(raw, &m); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func wantCode(t *testing.T, err error, code apierr.Code, status int) *apierr.Error {
	t.Helper()
	var e *apierr.Error
	if !errors.As(err, &e) {
		t.Fatalf("want %s (%d), got %v", code, status, err)
	}
	if e.Code != code || e.HTTPStatus() != status {
		t.Fatalf("want %s (%d), got %s (%d): %v", code, status, e.Code, e.HTTPStatus(), err)
	}
	return e
}

func ptr[T any](v T) *T { return &v }

var _ = fmt.Sprintf

func (f *fixture) deleteBudget(id uuid.UUID) {
	f.t.Helper()
	if err := f.svc.Delete(context.Background(), f.admin, id); err != nil {
		f.t.Fatal(err)
	}
}

func tenancyProject(name string) tenancy.NewProject { return tenancy.NewProject{Name: name} }

package payments_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/stripefake"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var (
	t0       = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	template = testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole}
)

const (
	secretA = "whsec_test_secret_a"
	secretB = "whsec_test_secret_b"
	apiKey  = "sk_test_fake_key"
)

// fixture is payments on a real database and the real billing ledger, talking to a
// local provider fake, with a manual clock.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	clk    *clock.Manual
	fake   *stripefake.Server
	bill   *billing.Service
	svc    *payments.Service
	tenant uuid.UUID
	admin  uuid.UUID
}

func newFixture(t *testing.T, edit ...func(*payments.Config)) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, template)
	clk := clock.NewManual(t0)
	fake := stripefake.New(apiKey)
	t.Cleanup(fake.Close)
	bill := billing.New(pool, clk, ids.V7{}, billing.Config{})
	cfg := payments.Config{
		ProviderBaseURL: fake.URL, ProviderAPIKey: apiKey, WebhookSecrets: []string{secretA},
		RefundWindow: 30 * 24 * time.Hour,
	}
	for _, e := range edit {
		e(&cfg)
	}
	svc, err := payments.New(pool, clk, ids.V7{}, cfg, bill.Ledger, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, pool: pool, clk: clk, fake: fake, bill: bill, svc: svc}
	f.tenant, f.admin = f.newTenant("acme")
	return f
}

func (f *fixture) newTenant(slug string) (tenant, admin uuid.UUID) {
	f.t.Helper()
	tenant, admin = uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `INSERT INTO tenants (id, name, slug, kind, created_at, updated_at)
		VALUES ($1, $2, $3, 'organization', $4, $4)`, tenant, slug, slug+"-"+tenant.String()[30:], t0); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `INSERT INTO users (id, username, display_name, tenant_id, tenant_role, created_at, updated_at)
		VALUES ($1, $2, 'Admin', $3, 'admin', $4, $4)`, admin, "adm-"+admin.String()[24:], tenant, t0); err != nil {
		f.t.Fatal(err)
	}
	return tenant, admin
}

// topUp starts a top-up of the fixture tenant.
func (f *fixture) topUp(currency string, amount int64) payments.TopUp {
	f.t.Helper()
	tu, err := f.svc.CreateTopUp(context.Background(), f.tenant, f.admin, currency, amount)
	if err != nil {
		f.t.Fatalf("top-up: %v", err)
	}
	return tu
}

func (f *fixture) sign(body []byte, secrets ...string) string {
	if len(secrets) == 0 {
		secrets = []string{secretA}
	}
	return stripefake.Sign(body, f.clk.Now(), secrets...)
}

// deliver posts body as the provider would, signed with secretA now.
func (f *fixture) deliver(body []byte) (payments.Ack, error) {
	return f.svc.ReceiveWebhook(context.Background(), payments.ProviderStripe, f.sign(body), bytes.NewReader(body))
}

func (f *fixture) mustDeliver(body []byte) payments.Ack {
	f.t.Helper()
	ack, err := f.deliver(body)
	if err != nil {
		f.t.Fatalf("deliver: %v", err)
	}
	return ack
}

// captured is a payment of amount the customer paid and whose webhook was applied.
func (f *fixture) captured(amount int64) payments.Payment {
	f.t.Helper()
	tu := f.topUp("USD", amount)
	pi := *tu.Payment.ProviderPaymentID
	f.fake.Succeed(pi)
	f.mustDeliver(f.fake.Event("payment_intent.succeeded", pi))
	return f.payment(tu.Payment.ID)
}

func (f *fixture) payment(id uuid.UUID) payments.Payment {
	f.t.Helper()
	p, err := f.svc.Get(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) balance(currency string) int64 {
	f.t.Helper()
	n, err := f.bill.WalletBalance(context.Background(), f.tenant, currency)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		f.t.Fatalf("count %q: %v", query, err)
	}
	return n
}

// rows counts the rows of every table of the schema: "writes nothing" is checked on
// all of them, not on the tables we expect to be touched.
func (f *fixture) rows() map[string]int {
	f.t.Helper()
	ctx := context.Background()
	r, err := f.pool.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY table_name`)
	if err != nil {
		f.t.Fatal(err)
	}
	var names []string
	for r.Next() {
		var n string
		if err := r.Scan(&n); err != nil {
			f.t.Fatal(err)
		}
		names = append(names, n)
	}
	r.Close()
	out := map[string]int{}
	for _, n := range names {
		out[n] = f.count(fmt.Sprintf(`SELECT count(*) FROM %q`, n))
	}
	return out
}

func sameRows(t *testing.T, before, after map[string]int) {
	t.Helper()
	for k, v := range after {
		if before[k] != v {
			t.Errorf("table %s: %d rows before, %d after", k, before[k], v)
		}
	}
}

func metric(c prometheus.Collector) int { return int(testutil.ToFloat64(c)) }

// wantCode asserts err is an *apierr.Error with code and HTTP status, and returns it.
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

func wantReason(t *testing.T, e *apierr.Error, reason string) {
	t.Helper()
	if got := e.Details["reason"]; got != reason {
		t.Fatalf("details.reason = %v, want %s (details %v)", got, reason, e.Details)
	}
}

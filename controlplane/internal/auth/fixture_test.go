package auth

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

const testPassword = "correct horse battery staple"

// fixture is one test's auth stack on its own database, with a manual clock.
type fixture struct {
	pool  *pgxpool.Pool
	clock *clock.Manual
	cfg   Config
	keys  *Keyring
	authn *Authenticator
	svc   *Service
}

func testMasterKey(b byte) MasterKey {
	var k MasterKey
	for i := range k.key {
		k.key[i] = b + byte(i)
	}
	k.set = true
	return k
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	return newReplica(t, pool, clock.NewManual(t0))
}

// newReplica is a second control-plane replica on the same database.
func newReplica(t *testing.T, pool *pgxpool.Pool, clk *clock.Manual) *fixture {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MasterKey = testMasterKey(1)
	keys, err := NewKeyring(pool, cfg, clk, ids.V7{})
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.EnsureActive(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &fixture{
		pool: pool, clock: clk, cfg: cfg, keys: keys,
		authn: NewAuthenticator(keys, cfg, clk),
		svc:   NewService(pool, cfg, keys, clk, ids.V7{}),
	}
}

type userOpts struct {
	role     string   // users.role, default "user"
	status   string   // default "active"
	tenant   bool     // put the user in a new tenant as its admin
	bindings []string // platform_role_bindings
	noPass   bool
}

// createUser inserts a user (and optionally its tenant) and returns its id.
func (f *fixture) createUser(t *testing.T, username string, o userOpts) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	if o.role == "" {
		o.role = "user"
	}
	if o.status == "" {
		o.status = "active"
	}
	var hash *string
	if !o.noPass {
		h, err := HashPassword(testPassword)
		if err != nil {
			t.Fatal(err)
		}
		hash = &h
	}
	var tenant uuid.NullUUID
	var trole *string
	if o.tenant {
		tenant = uuid.NullUUID{UUID: uuid.Must(uuid.NewV7()), Valid: true}
		if _, err := f.pool.Exec(ctx, `INSERT INTO tenants (id, name, slug, kind, created_at, updated_at)
			VALUES ($1, $2, $3, 'personal', $4, $4)`, tenant.UUID, username+" org", username+"-org", t0); err != nil {
			t.Fatal(err)
		}
		trole = ptr("admin")
	}
	id := uuid.Must(uuid.NewV7())
	if _, err := f.pool.Exec(ctx, `INSERT INTO users (id, username, display_name, password_hash, role, tenant_id, tenant_role, status, created_at, updated_at)
		VALUES ($1, $2, $2, $3, $4, $5, $6, $7, $8, $8)`, id, username, hash, o.role, tenant, trole, o.status, t0); err != nil {
		t.Fatal(err)
	}
	for _, r := range o.bindings {
		if _, err := f.pool.Exec(ctx, `INSERT INTO platform_role_bindings (user_id, role, created_at) VALUES ($1, $2, $3)`, id, r, t0); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

func (f *fixture) authenticate(token string) error {
	r := httptest.NewRequest("GET", "/api/v1/me", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	_, err := f.authn.Authenticate(r)
	return err
}

// auditCount counts audit rows of action.
func (f *fixture) auditCount(t *testing.T, action string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_events WHERE action = $1`, action).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantCode fails unless err is an *apierr.Error with code.
func wantCode(t *testing.T, err error, code apierr.Code) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("err = %v, want nil", err)
		}
		return
	}
	e, ok := apierr.As(err)
	if !ok {
		t.Fatalf("err = %v (%T), want *apierr.Error %s", err, err, code)
	}
	if e.Code != code {
		t.Fatalf("code = %s (%v), want %s", e.Code, err, code)
	}
}

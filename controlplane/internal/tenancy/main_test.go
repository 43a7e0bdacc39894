package tenancy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func fakeHash(pw string) (string, error) { return "test$" + pw, nil }

type fixture struct {
	t    *testing.T
	pool *pgxpool.Pool
	svc  *tenancy.Service
	clk  *clock.Manual
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	clk := clock.NewManual(t0)
	return &fixture{t: t, pool: pool, clk: clk, svc: tenancy.New(pool, clk, ids.V7{}, fakeHash)}
}

// org provisions an organization whose admin is username.
func (f *fixture) org(name, admin string) tenancy.Provisioned {
	f.t.Helper()
	var out tenancy.Provisioned
	err := db.InTx(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		out, err = f.svc.Provision(context.Background(), tx, tenancy.ProvisionInput{
			Kind: tenancy.KindOrganization, Name: name,
			Admin: tenancy.NewUser{Username: admin, Password: "correct horse battery"},
		})
		return err
	})
	if err != nil {
		f.t.Fatalf("provision %s: %v", name, err)
	}
	return out
}

// adminOf is the principal of a provisioned tenant's admin.
func adminOf(p tenancy.Provisioned) *principal.Principal {
	return &principal.Principal{UserID: p.Admin.ID, Username: p.Admin.Username, TenantID: p.Tenant.ID, TenantRole: principal.TenantRoleAdmin, RoleSource: principal.RoleSourceBindings}
}

// user creates a tenant member and returns its principal.
func (f *fixture) user(p tenancy.Provisioned, username string) *principal.Principal {
	f.t.Helper()
	u, err := f.svc.CreateUser(context.Background(), adminOf(p), tenancy.NewUser{
		Username: username, Password: "correct horse battery", TenantRole: principal.TenantRoleMember,
	})
	if err != nil {
		f.t.Fatalf("create user %s: %v", username, err)
	}
	return &principal.Principal{UserID: u.ID, Username: username, TenantID: p.Tenant.ID, TenantRole: principal.TenantRoleMember}
}

// access resolves the project context as p, failing the test on refusal.
func (f *fixture) access(p *principal.Principal, project uuid.UUID) projectctx.Project {
	f.t.Helper()
	pc, err := f.svc.Access(context.Background(), p, project)
	if err != nil {
		f.t.Fatalf("access: %v", err)
	}
	return pc
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		f.t.Fatalf("count %q: %v", query, err)
	}
	return n
}

func (f *fixture) audits(action string) int {
	return f.count(`SELECT count(*) FROM audit_events WHERE action = $1`, action)
}

func (f *fixture) events(typ string) int {
	return f.count(`SELECT count(*) FROM outbox_events WHERE event_type = $1`, typ)
}

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

func wantDetail(t *testing.T, e *apierr.Error, key string, want any) {
	t.Helper()
	if got := e.Details[key]; got != want {
		t.Fatalf("details[%s] = %v, want %v (details %v)", key, got, want, e.Details)
	}
}

type (
	pgxTx = pgx.Tx
	uuidT = uuid.UUID
)

// principalOutside is a platform user outside any tenant.
var principalOutside = principal.Principal{UserID: uuid.MustParse("01900000-0000-7000-8000-00000000dead")}

// rootUser inserts a platform superadmin outside any tenant (users.role = admin).
func (f *fixture) rootUser() *principal.Principal {
	f.t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, err := f.pool.Exec(context.Background(),
		`INSERT INTO users (id, username, display_name, role, created_at, updated_at) VALUES ($1, 'root', 'Root', 'admin', $2, $2)`, id, t0); err != nil {
		f.t.Fatal(err)
	}
	return &principal.Principal{UserID: id, Username: "root", PlatformRole: []string{principal.RoleSuperadmin},
		RoleSource: principal.RoleSourceUsers, Capabilities: principal.CapabilitiesFor([]string{principal.RoleSuperadmin})}
}

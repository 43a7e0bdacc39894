package devenv_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/devenv"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/natsenv"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The seed runs through the control plane's pool, so as the application's database role.
var template = testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole}

const (
	adminPW = "admin-password-one"
	demoPW  = "demo-password-one"
)

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func hashOf(t *testing.T, pool *pgxpool.Pool, username string) *string {
	t.Helper()
	var h *string
	if err := pool.QueryRow(context.Background(), `SELECT password_hash FROM users WHERE username = $1`, username).Scan(&h); err != nil {
		t.Fatalf("hash of %s: %v", username, err)
	}
	return h
}

func seed(t *testing.T, pool *pgxpool.Pool, admin, demo string) devenv.Seeded {
	t.Helper()
	out, err := devenv.Seed(context.Background(), pool, devenv.SeedInput{AdminPassword: admin, DemoPassword: demo})
	if err != nil {
		t.Fatalf("seed: %v", err)
	}
	return out
}

func TestSeedTwiceChangesNothing(t *testing.T) {
	pool := testenv.NewDatabase(t, template)
	first := seed(t, pool, adminPW, demoPW)
	base := slices.DeleteFunc(slices.Clone(first.Changes), func(c string) bool { return strings.HasPrefix(c, "created app ") })
	if len(base) != 7 {
		t.Fatalf("first seed changes = %q, want admin, demo tenant, pricing plan, demo credit, dev region and two SKUs (and the dev apps: TestSeedApps)", first.Changes)
	}
	var skus int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM catalog_skus WHERE $1 = ANY(regions)`, devenv.DevRegion).Scan(&skus); err != nil || skus != 2 {
		t.Fatalf("dev SKUs in %s: %d, %v", devenv.DevRegion, skus, err)
	}
	second := seed(t, pool, adminPW, demoPW)
	if len(second.Changes) != 0 {
		t.Fatalf("second seed changed %q", second.Changes)
	}
	if first.AdminID != second.AdminID || first.TenantID != second.TenantID || first.DemoUserID != second.DemoUserID ||
		first.DepartmentID != second.DepartmentID || first.ProjectID != second.ProjectID {
		t.Fatalf("ids differ:\n first  %+v\n second %+v", first, second)
	}

	checks := []struct {
		what  string
		query string
		args  []any
	}{
		{"users", `SELECT count(*) FROM users`, nil},
		{"platform admin", `SELECT count(*) FROM users WHERE role = 'admin'`, nil},
		{"admin is bound platform_superadmin", `SELECT count(*) FROM platform_role_bindings WHERE user_id = $1 AND role = 'platform_superadmin'`, []any{first.AdminID}},
		{"one superadmin binding", `SELECT count(*) FROM platform_role_bindings WHERE role = 'platform_superadmin'`, nil},
		{"admin outside tenants", `SELECT count(*) FROM users WHERE id = $1 AND username = 'admin' AND role = 'admin' AND tenant_id IS NULL AND tenant_role IS NULL`, []any{first.AdminID}},
		{"demo tenant", `SELECT count(*) FROM tenants WHERE slug = 'demo' AND name = 'Demo' AND id = $1`, []any{first.TenantID}},
		{"tenants", `SELECT count(*) FROM tenants`, nil},
		{"default department", `SELECT count(*) FROM departments WHERE tenant_id = $1 AND is_default AND id = $2`, []any{first.TenantID, first.DepartmentID}},
		{"default project", `SELECT count(*) FROM projects WHERE tenant_id = $1 AND is_default AND id = $2 AND department_id = $3`, []any{first.TenantID, first.ProjectID, first.DepartmentID}},
		{"projects", `SELECT count(*) FROM projects`, nil},
		{"demo is tenant admin", `SELECT count(*) FROM users WHERE id = $1 AND username = 'demo' AND tenant_id = $2 AND tenant_role = 'admin' AND role = 'user'`, []any{first.DemoUserID, first.TenantID}},
		{"demo owns default project", `SELECT count(*) FROM project_members WHERE project_id = $1 AND user_id = $2 AND role = 'owner'`, []any{first.ProjectID, first.DemoUserID}},
		{"tenant.create audit", `SELECT count(*) FROM audit_events WHERE action = 'tenant.create'`, nil},
		{"admin user.create audit", `SELECT count(*) FROM audit_events WHERE action = 'user.create' AND target_id = $1`, []any{first.AdminID.String()}},
		{"default pricing plan", `SELECT count(*) FROM billing_pricing_plans WHERE is_default`, nil},
		{"demo credit posted once", `SELECT count(*) FROM billing_ledger_transactions WHERE kind = 'adjustment' AND tenant_id = $1`, []any{first.TenantID}},
		{"demo starting balance", `SELECT count(*) FROM billing_ledger_accounts WHERE kind = 'tenant_wallet' AND tenant_id = $1 AND balance_minor = $2`, []any{first.TenantID, devenv.DemoCredit}},
	}
	want := map[string]int{"users": 2}
	for _, c := range checks {
		w, ok := want[c.what]
		if !ok {
			w = 1
		}
		if got := count(t, pool, c.query, c.args...); got != w {
			t.Errorf("%s: %d rows, want %d", c.what, got, w)
		}
	}
	if !auth.CheckPassword(adminPW, hashOf(t, pool, "admin")) || !auth.CheckPassword(demoPW, hashOf(t, pool, "demo")) {
		t.Fatal("seeded passwords do not verify")
	}
	if h := hashOf(t, pool, "demo"); !strings.HasPrefix(*h, "$argon2id$") {
		t.Fatalf("demo hash %q is not argon2id", *h)
	}
}

func TestSeedResetsPasswordsAndRepairsDemo(t *testing.T) {
	pool := testenv.NewDatabase(t, template)
	first := seed(t, pool, adminPW, demoPW)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `UPDATE project_members SET role = 'member' WHERE user_id = $1`, first.DemoUserID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE users SET role = 'user' WHERE id = $1`, first.AdminID); err != nil {
		t.Fatal(err)
	}

	second := seed(t, pool, "admin-password-two", "demo-password-two")
	if len(second.Changes) != 4 {
		t.Fatalf("changes = %q, want admin role, ownership and two password resets", second.Changes)
	}
	if second.AdminID != first.AdminID || second.DemoUserID != first.DemoUserID || second.ProjectID != first.ProjectID {
		t.Fatalf("ids changed: %+v vs %+v", first, second)
	}
	if auth.CheckPassword(adminPW, hashOf(t, pool, "admin")) || !auth.CheckPassword("admin-password-two", hashOf(t, pool, "admin")) {
		t.Fatal("admin password not reset")
	}
	if auth.CheckPassword(demoPW, hashOf(t, pool, "demo")) || !auth.CheckPassword("demo-password-two", hashOf(t, pool, "demo")) {
		t.Fatal("demo password not reset")
	}
	if got := count(t, pool, `SELECT count(*) FROM project_members WHERE user_id = $1 AND role = 'owner'`, first.DemoUserID); got != 1 {
		t.Fatalf("demo ownership not restored: %d", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM users WHERE role = 'admin'`); got != 1 {
		t.Fatalf("platform admins = %d", got)
	}
	if third := seed(t, pool, "admin-password-two", "demo-password-two"); len(third.Changes) != 0 {
		t.Fatalf("third seed changed %q", third.Changes)
	}
}

func TestSeedRefusesTenantUserNamedAdmin(t *testing.T) {
	pool := testenv.NewDatabase(t, template)
	seed(t, pool, adminPW, demoPW)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `UPDATE users SET username = 'admin-old' WHERE username = 'admin'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE users SET username = 'admin' WHERE username = 'demo'`); err != nil {
		t.Fatal(err)
	}
	_, err := devenv.Seed(ctx, pool, devenv.SeedInput{AdminPassword: adminPW, DemoPassword: demoPW})
	if err == nil || !strings.Contains(err.Error(), "belongs to a tenant") {
		t.Fatalf("err = %v", err)
	}
}

// TestSeedDemoServiceAccount: with a client secret the seed adds the demo service account
// (member of the default project) and its credential, stored as the secret's SHA-256;
// again changes nothing; a revoked credential or a new secret is reset.
func TestSeedDemoServiceAccount(t *testing.T) {
	pool := testenv.NewDatabase(t, template)
	ctx := context.Background()
	secret := auth.ClientSecretPrefix + strings.Repeat("A", 43)
	in := devenv.SeedInput{AdminPassword: adminPW, DemoPassword: demoPW, DemoClientSecret: secret}
	first, err := devenv.Seed(ctx, pool, in)
	if err != nil {
		t.Fatal(err)
	}
	if first.DemoClientID != devenv.DemoClientID {
		t.Fatalf("client id %q", first.DemoClientID)
	}
	sum := sha256.Sum256([]byte(secret))
	active := `SELECT count(*) FROM access_credentials c JOIN service_accounts sa ON sa.id = c.service_account_id
		JOIN service_account_project_roles r ON r.service_account_id = sa.id AND r.project_id = $3 AND r.role = 'member'
		WHERE c.client_id = $1 AND c.secret_hash = $2 AND c.revoked_at IS NULL AND sa.name = 'demo-ci' AND sa.tenant_id = $4`
	if n := count(t, pool, active, devenv.DemoClientID, sum[:], first.ProjectID, first.TenantID); n != 1 {
		t.Fatal("demo credential not seeded")
	}
	again, err := devenv.Seed(ctx, pool, in)
	if err != nil || len(again.Changes) != 0 {
		t.Fatalf("second seed changed %q, %v", again.Changes, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE access_credentials SET revoked_at = now() WHERE client_id = $1`, devenv.DemoClientID); err != nil {
		t.Fatal(err)
	}
	in.DemoClientSecret = auth.ClientSecretPrefix + strings.Repeat("B", 43)
	if _, err := devenv.Seed(ctx, pool, in); err != nil {
		t.Fatal(err)
	}
	sum = sha256.Sum256([]byte(in.DemoClientSecret))
	if n := count(t, pool, active, devenv.DemoClientID, sum[:], first.ProjectID, first.TenantID); n != 1 {
		t.Fatal("demo credential not reset to the new secret")
	}
}

func TestLoadSecretsPersists(t *testing.T) {
	dir := t.TempDir()
	s1, gen, err := devenv.LoadSecrets(dir)
	if err != nil || len(gen) != 4 {
		t.Fatalf("first load: generated %v, %v", gen, err)
	}
	path := filepath.Join(dir, devenv.SecretsFile)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file: %v %v", fi, err)
	}
	if _, err := auth.ParseMasterKey(s1.MasterKey); err != nil {
		t.Fatal(err)
	}
	for _, pw := range []string{s1.AdminPassword, s1.DemoPassword} {
		if len(pw) < 16 || auth.ValidatePassword(pw) != nil {
			t.Fatalf("password %q too weak", pw)
		}
	}
	if s1.AdminPassword == s1.DemoPassword {
		t.Fatal("admin and demo passwords are equal")
	}

	s2, gen, err := devenv.LoadSecrets(dir)
	if err != nil || len(gen) != 0 || s2 != s1 {
		t.Fatalf("second load: %+v generated %v, %v", s2, gen, err)
	}

	// A wider mode is narrowed; a dropped variable is regenerated alone.
	vars, _ := devenv.ReadEnvFile(path)
	if err := devenv.WriteEnvFile(path, "", []devenv.Var{{Key: devenv.VarMasterKey, Value: vars[devenv.VarMasterKey]}, {Key: devenv.VarAdminPassword, Value: vars[devenv.VarAdminPassword]}}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	s3, gen, err := devenv.LoadSecrets(dir)
	if err != nil || len(gen) != 2 || gen[0] != devenv.VarDemoPassword || gen[1] != devenv.VarDemoClientSecret {
		t.Fatalf("third load: generated %v, %v", gen, err)
	}
	if s3.MasterKey != s1.MasterKey || s3.AdminPassword != s1.AdminPassword || s3.DemoPassword == s1.DemoPassword ||
		!strings.HasPrefix(s3.DemoClientSecret, auth.ClientSecretPrefix) || s3.DemoClientSecret == s1.DemoClientSecret {
		t.Fatalf("third load: %+v", s3)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v after rewrite", fi.Mode())
	}
}

func TestEnvFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.env")
	vars := []devenv.Var{{Key: "A", Value: "postgres://u@h/db?x=1&y=2"}, {Key: "B", Value: "it's"}, {Key: "C", Value: ""}}
	if err := devenv.WriteEnvFile(path, "header\nlines", vars); err != nil {
		t.Fatal(err)
	}
	got, err := devenv.ReadEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		if got[v.Key] != v.Value {
			t.Fatalf("%s = %q, want %q", v.Key, got[v.Key], v.Value)
		}
	}
}

func TestStartWithDatabaseURLAndEmbeddedNATS(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("GANTRY_MASTER_KEY", "")
	t.Setenv("GANTRY_MIGRATE_DATABASE_URL", "")
	t.Setenv("GANTRY_APP_DATABASE_ROLE", "")
	// DATABASE_URL alone names the owner: dev migrates with it and runs the control
	// plane as the application role on the same database.
	url := testenv.OwnerURL(t, testenv.DatabaseURL(t, template))
	dir := filepath.Join(t.TempDir(), "dev")
	env, err := devenv.Start(context.Background(), devenv.Options{Dir: dir, DatabaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	appURL, _ := db.AppURL(url, db.AppRole)
	if env.MigrateDatabaseURL != url || env.DatabaseURL != appURL || env.AppRole != db.AppRole || env.Postgres != "DATABASE_URL" {
		t.Fatalf("postgres: app %q, owner %q (%s)", env.DatabaseURL, env.MigrateDatabaseURL, env.Postgres)
	}
	appPool, err := pgxpool.New(context.Background(), env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer appPool.Close()
	if role, err := db.CheckSessionRole(context.Background(), appPool); err != nil || role != db.AppRole {
		t.Fatalf("the control plane would log in as %q: %v", role, err)
	}
	if !natsenv.HasJetStream(env.NATSURL) {
		t.Fatalf("embedded NATS at %s has no JetStream", env.NATSURL)
	}
	if env.MasterKey != env.Secrets.MasterKey {
		t.Fatal("master key is not the one of secrets.env")
	}
	if b, err := os.ReadFile(env.SSHPublicKey); err != nil || !strings.HasPrefix(string(b), "ssh-ed25519 ") {
		t.Fatalf("demo ssh key: %q %v", b, err)
	}
	natsURL := env.NATSURL
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	if natsenv.Reachable(natsURL) {
		t.Fatal("embedded NATS still answers after Close")
	}

	// Another master key on a database named by DATABASE_URL is refused, not repaired.
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mk, _ := auth.ParseMasterKey(env.MasterKey)
	cfg := auth.DefaultConfig()
	cfg.MasterKey = mk
	ring, err := auth.NewKeyring(pool, cfg, clock.Real{}, ids.V7{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ring.EnsureActive(ctx); err != nil {
		t.Fatal(err)
	}
	otherKey := "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	if _, err := devenv.Start(ctx, devenv.Options{Dir: dir, DatabaseURL: url, MasterKey: otherKey}); err == nil || !strings.Contains(err.Error(), "GANTRY_MASTER_KEY") {
		t.Fatalf("start with another master key: %v", err)
	}
	again, err := devenv.Start(ctx, devenv.Options{Dir: dir, DatabaseURL: url})
	if err != nil {
		t.Fatalf("start again with the key of secrets.env: %v", err)
	}
	if again.Secrets != env.Secrets {
		t.Fatal("secrets changed between runs")
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}

// Production's pair of URLs: GANTRY_MIGRATE_DATABASE_URL is the owner's, DATABASE_URL the
// application role's; a DATABASE_URL that logs in as the owner is refused.
func TestStartWithTwoDatabaseURLs(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("GANTRY_MASTER_KEY", "")
	t.Setenv("GANTRY_APP_DATABASE_ROLE", "")
	appURL := testenv.DatabaseURL(t, template)
	owner := testenv.OwnerURL(t, appURL)
	dir := filepath.Join(t.TempDir(), "dev")
	env, err := devenv.Start(context.Background(), devenv.Options{Dir: dir, DatabaseURL: appURL, MigrateDatabaseURL: owner})
	if err != nil {
		t.Fatal(err)
	}
	if env.DatabaseURL != appURL || env.MigrateDatabaseURL != owner || env.Postgres != "GANTRY_MIGRATE_DATABASE_URL" {
		t.Fatalf("postgres: app %q, owner %q (%s)", env.DatabaseURL, env.MigrateDatabaseURL, env.Postgres)
	}
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = devenv.Start(context.Background(), devenv.Options{Dir: dir, DatabaseURL: owner, MigrateDatabaseURL: owner})
	if !errors.Is(err, db.ErrPrivilegedRole) {
		t.Fatalf("the owner as the control plane's role: %v, want ErrPrivilegedRole", err)
	}
}

package apitest

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Password is the password of every fixture user.
const Password = "correct horse battery staple"

// PlatformAdmin creates a platform superadmin outside any tenant and returns its
// access token. (There is no API to create the first platform admin: `make dev` and
// operators seed it, so the fixture writes the row.)
func (e *Env) PlatformAdmin(t testing.TB) (uuid.UUID, string) {
	t.Helper()
	ctx := context.Background()
	hash, err := auth.HashPassword(Password)
	if err != nil {
		t.Fatal(err)
	}
	id := e.App.IDs.New()
	now := e.App.Clock.Now()
	_, err = e.Pool.Exec(ctx, `INSERT INTO users (id, username, display_name, password_hash, role, created_at, updated_at)
		VALUES ($1, $2, 'Platform Admin', $3, 'admin', $4, $4)`, id, "admin-"+id.String()[24:], hash, now)
	if err != nil {
		t.Fatalf("seed platform admin: %v", err)
	}
	return id, e.Token(t, id)
}

// Token issues an access token for a user directly (tests of other features).
func (e *Env) Token(t testing.TB, userID uuid.UUID) string {
	t.Helper()
	toks, err := e.App.Auth.IssueFor(context.Background(), userID)
	if err != nil {
		t.Fatalf("issue token: %v", err)
	}
	return toks.AccessToken
}

// Tenant is a tenant created through the admin API.
type Tenant struct {
	ID             uuid.UUID
	AdminID        uuid.UUID
	AdminUsername  string
	AdminToken     string
	DefaultProject uuid.UUID
	DefaultDept    uuid.UUID
}

// NewTenant creates a tenant (with its first admin) through POST /api/v1/admin/tenants
// and logs its admin in through POST /api/v1/auth/login.
func (e *Env) NewTenant(t testing.TB, adminToken, name string) Tenant {
	t.Helper()
	username := fmt.Sprintf("adm-%s", uuid.NewString()[:8])
	resp, err := e.Client(adminToken).CreateTenantWithResponse(context.Background(), &api.CreateTenantParams{}, api.CreateTenantJSONRequestBody{
		Name:  name,
		Slug:  "t-" + uuid.NewString()[:8],
		Admin: api.CreateTenantAdmin{Username: username, Password: Password},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != http.StatusCreated {
		t.Fatalf("create tenant: %d %s", resp.StatusCode(), resp.Body)
	}
	c := resp.JSON201
	return Tenant{
		ID: c.Tenant.ID, AdminID: c.AdminUser.ID, AdminUsername: username,
		AdminToken: e.Login(t, username, Password), DefaultProject: c.DefaultProject.ID, DefaultDept: c.DefaultDepartment.ID,
	}
}

// NewUser creates a member of the tenant through POST /api/v1/users and logs it in.
func (e *Env) NewUser(t testing.TB, tenantAdminToken, role string) (uuid.UUID, string) {
	t.Helper()
	username := fmt.Sprintf("usr-%s", uuid.NewString()[:8])
	resp, err := e.Client(tenantAdminToken).CreateTenantUserWithResponse(context.Background(), &api.CreateTenantUserParams{}, api.CreateTenantUserJSONRequestBody{
		Username: username, Password: Password, TenantRole: api.TenantRole(role),
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != http.StatusCreated {
		t.Fatalf("create user: %d %s", resp.StatusCode(), resp.Body)
	}
	return resp.JSON201.ID, e.Login(t, username, Password)
}

// Login signs in through the API and returns the access token.
func (e *Env) Login(t testing.TB, username, password string) string {
	t.Helper()
	resp, err := e.Client("").LoginWithResponse(context.Background(), &api.LoginParams{}, api.LoginJSONRequestBody{Username: username, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != http.StatusOK {
		t.Fatalf("login %s: %d %s", username, resp.StatusCode(), resp.Body)
	}
	return resp.JSON200.AccessToken
}

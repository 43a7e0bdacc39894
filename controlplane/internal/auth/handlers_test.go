package auth

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// personalProvisioner is the smallest TenantProvisioner: a personal tenant and its admin.
type personalProvisioner struct{ fail error }

func (p personalProvisioner) ProvisionPersonal(ctx context.Context, tx pgx.Tx, username, password, displayName, orgName string) (uuid.UUID, error) {
	if p.fail != nil {
		return uuid.Nil, p.fail
	}
	hash, err := HashPassword(password)
	if err != nil {
		return uuid.Nil, err
	}
	tenant, user := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	if _, err := tx.Exec(ctx, `INSERT INTO tenants (id, name, slug, kind, created_at, updated_at) VALUES ($1, $2, $3, 'personal', now(), now())`,
		tenant, orgName, "p-"+strings.ReplaceAll(tenant.String(), "-", "")[20:]); err != nil {
		return uuid.Nil, err
	}
	_, err = tx.Exec(ctx, `INSERT INTO users (id, username, display_name, password_hash, tenant_id, tenant_role, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, 'admin', now(), now())`, user, username, displayName, hash, tenant)
	return user, err
}

func (f *fixture) handlers(mod func(*Config)) *Handlers {
	cfg := f.cfg
	if mod != nil {
		mod(&cfg)
	}
	return NewHandlers(f.svc, f.keys, cfg, personalProvisioner{})
}

func TestSignupHandler(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	body := &api.SignupRequest{Username: "alice", Password: testPassword, OrganizationName: "Alice Labs"}

	_, err := f.handlers(func(c *Config) { c.PersonalSignup = false }).Signup(ctx, api.SignupRequestObject{Body: body})
	wantCode(t, err, apierr.AuthPersonalDisabled)
	if e, _ := apierr.As(err); e.HTTPStatus() != http.StatusForbidden {
		t.Errorf("status %d, want 403", e.HTTPStatus())
	}

	h := f.handlers(nil)
	resp, err := h.Signup(ctx, api.SignupRequestObject{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	created, ok := resp.(api.Signup201JSONResponse)
	if !ok {
		t.Fatalf("response %T", resp)
	}
	if created.Body.User.Username != "alice" || created.Body.TokenType != api.AuthTokenResponseTokenTypeBearer ||
		created.Body.ExpiresIn != 900 || created.Body.RefreshExpiresIn != 30*24*3600 {
		t.Errorf("body = %+v", created.Body)
	}
	wantCode(t, f.authenticate(created.Body.AccessToken), "")

	// Taken username: the unique violation becomes user_already_exists; nothing persists.
	_, err = h.Signup(ctx, api.SignupRequestObject{Body: &api.SignupRequest{Username: "alice", Password: testPassword, OrganizationName: "Again"}})
	wantCode(t, err, apierr.UserAlreadyExists)
	var tenants int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM tenants`).Scan(&tenants); err != nil || tenants != 1 {
		t.Errorf("%d tenants after a refused sign-up (%v), want 1", tenants, err)
	}

	// A failing provisioner leaves no session behind either.
	failing := NewHandlers(f.svc, f.keys, f.cfg, personalProvisioner{fail: apierr.New(apierr.ValidationError, "nope")})
	_, err = failing.Signup(ctx, api.SignupRequestObject{Body: &api.SignupRequest{Username: "bob", Password: testPassword, OrganizationName: "Bob"}})
	wantCode(t, err, apierr.ValidationError)
	_, err = h.Signup(ctx, api.SignupRequestObject{Body: &api.SignupRequest{Username: "carol", Password: "short", OrganizationName: "C"}})
	wantCode(t, err, apierr.ValidationError)
}

func TestLoginRefreshLogoutHandlers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.createUser(t, "alice", userOpts{role: "admin"})
	h := f.handlers(nil)

	_, err := h.Login(ctx, api.LoginRequestObject{Body: &api.LoginRequest{Username: "alice", Password: "wrong password!"}})
	wantCode(t, err, apierr.TokenInvalid)

	resp, err := h.Login(ctx, api.LoginRequestObject{Body: &api.LoginRequest{Username: "alice", Password: testPassword}})
	if err != nil {
		t.Fatal(err)
	}
	login := resp.(api.Login200JSONResponse).Body
	if login.User.Role != api.UserRoleAdmin {
		t.Errorf("user = %+v", login.User)
	}
	rresp, err := h.RefreshToken(ctx, api.RefreshTokenRequestObject{Body: &api.RefreshTokenRequest{RefreshToken: login.RefreshToken}})
	if err != nil {
		t.Fatal(err)
	}
	refreshed := rresp.(api.RefreshToken200JSONResponse).Body
	r := httptest.NewRequest("POST", "/api/v1/auth/logout", nil)
	r.Header.Set("Authorization", "Bearer "+refreshed.AccessToken)
	p, err := f.authn.Authenticate(r)
	if err != nil {
		t.Fatal(err)
	}
	lctx := withPrincipal(ctx, AuthTokens{Identity: Identity{UserID: p.UserID, PlatformRoles: p.PlatformRole, RoleSource: p.RoleSource}})
	if _, err := h.Logout(lctx, api.LogoutRequestObject{Body: &api.LogoutRequest{RefreshToken: refreshed.RefreshToken}}); err != nil {
		t.Fatal(err)
	}
	_, err = h.RefreshToken(ctx, api.RefreshTokenRequestObject{Body: &api.RefreshTokenRequest{RefreshToken: refreshed.RefreshToken}})
	wantCode(t, err, apierr.TokenInvalid)
}

func TestJWKSHandlers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()

	resp, err := f.handlers(nil).GetJWKS(ctx, api.GetJWKSRequestObject{})
	if err != nil {
		t.Fatal(err)
	}
	keys := resp.(api.GetJWKS200JSONResponse).Body.Keys
	if len(keys) != 1 || keys[0]["kid"] != f.keys.ActiveKID() {
		t.Fatalf("jwks = %v", keys)
	}

	// RefreshJWKS through the strict middleware, as the server mounts it.
	call := func(h *Handlers, header string) (any, error) {
		r := httptest.NewRequest("POST", "/internal/auth/jwks/refresh", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		inner := func(ctx context.Context, _ http.ResponseWriter, _ *http.Request, req any) (any, error) {
			return h.RefreshJWKS(ctx, req.(api.RefreshJWKSRequestObject))
		}
		return h.StrictMiddleware(inner, "RefreshJWKS")(r.Context(), httptest.NewRecorder(), r, api.RefreshJWKSRequestObject{})
	}

	_, err = call(f.handlers(nil), "Bearer anything")
	wantCode(t, err, apierr.InvalidRequest)
	if e, _ := apierr.As(err); e.HTTPStatus() != http.StatusNotFound || e.Message != "not found" {
		t.Errorf("disabled refresh = %d %q, want 404 not found", e.HTTPStatus(), e.Message)
	}

	h := f.handlers(func(c *Config) { c.InternalJWKSRefreshToken = "s3cret-internal-token" })
	for _, header := range []string{"", "Bearer wrong", "Bearer s3cret-internal-token-longer", "Basic s3cret-internal-token"} {
		_, err = call(h, header)
		wantCode(t, err, apierr.TokenInvalid)
	}
	out, err := call(h, "Bearer s3cret-internal-token")
	if err != nil {
		t.Fatal(err)
	}
	if body := out.(api.RefreshJWKS200JSONResponse).Body; !body.Ok || body.KeyCount != 1 {
		t.Errorf("refresh = %+v", body)
	}
}

package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Enterprise sign-in through OIDC federation (docs/api.md, "Enterprise sign-in (OIDC)").
//
// A platform admin stores a tenant's identity provider (PutIdentityProvider: the issuer
// is checked by discovery, the client secret sealed with the master key). A sign-in is
// two requests of the authorization-code flow:
//
//	start:    new state, nonce, PKCE verifier and flow cookie → auth_oidc_flows row
//	          (hashes of state and cookie; 10 minutes) → 302 to the provider
//	callback: take the row by state (deleted whatever happens next: single use) → the
//	          cookie must match → code exchange with the verifier → ID token verified by
//	          go-oidc (issuer, audience, expiry, RS256/ES256 only) → nonce → verified
//	          email in an allowed domain → user provisioned or updated → our tokens
//
// Nothing but the spent flow row changes unless every check passes.
//
// Sign-in modes (seed §5 rule 9): a federated user (auth_federated_identities) signing
// in with a password is auth_enterprise_required; a password user of a federated
// tenant that turned password_sign_in off is auth_personal_disabled; an enterprise
// sign-in whose email is a password (personal) account, or whose tenant is personal,
// is auth_personal_required.

const (
	// oidcFlowTTL is how long a started sign-in may take at the provider.
	oidcFlowTTL = 10 * time.Minute
	// oidcHTTPTimeout bounds discovery, key fetches and the code exchange.
	oidcHTTPTimeout = 10 * time.Second
	// OIDCFlowCookie binds a started sign-in to the browser that started it.
	OIDCFlowCookie = "gantry_oidc"
)

// oidcSigningAlgs is the allow-list of ID-token algorithms; anything else (HS256,
// none, RS384 ...) is refused by the verifier.
var oidcSigningAlgs = []string{oidc.RS256, oidc.ES256}

// IdentityProvider is a tenant's federation settings, without the secret.
type IdentityProvider struct {
	TenantID        uuid.UUID
	Slug            string
	Issuer          string
	ClientID        string
	ClientSecretSet bool
	RedirectURL     string
	AllowedDomains  []string
	RoleClaim       string
	RoleMapping     map[string]string
	PasswordSignIn  bool
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// IdentityProviderInput is what PutIdentityProvider stores.
type IdentityProviderInput struct {
	Issuer, ClientID, ClientSecret, RedirectURL, RoleClaim string
	AllowedDomains                                         []string
	RoleMapping                                            map[string]string
	PasswordSignIn                                         bool
}

// oidcHTTP is the client for every call to a provider (overridable in tests only
// through the context, see oidcContext).
var oidcHTTP = &http.Client{Timeout: oidcHTTPTimeout}

func oidcContext(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, oidcHTTP)
}

func idpNotFound() *apierr.Error {
	e := apierr.New(apierr.InvalidRequest, "identity provider not found").With("reason", "not_found")
	e.Status = 404
	return e
}

func tenantNotFound() *apierr.Error {
	e := apierr.New(apierr.InvalidRequest, "tenant not found").With("reason", "not_found")
	e.Status = 404
	return e
}

// errSignIn is the one refusal of a callback: 401 token_invalid with the reason.
func errSignIn(reason, msg string) *apierr.Error {
	return apierr.New(apierr.TokenInvalid, "%s", msg).With("reason", reason)
}

func idpAAD(tenantID uuid.UUID) []byte {
	return []byte("gantry/auth/oidc-client-secret/" + tenantID.String())
}

// sealIdPSecret encrypts a client secret under the master key, bound to the tenant.
func (m MasterKey) sealIdPSecret(secret string, tenantID uuid.UUID) ([]byte, error) {
	return m.sealAD([]byte(secret), idpAAD(tenantID))
}

func (m MasterKey) openIdPSecret(sealed []byte, tenantID uuid.UUID) (string, error) {
	plain, err := m.openAD(sealed, idpAAD(tenantID), "client secret")
	return string(plain), err
}

func toIdentityProvider(slug string, r authdb.TenantIdentityProvider) (IdentityProvider, error) {
	m := map[string]string{}
	if len(r.RoleMapping) > 0 {
		if err := json.Unmarshal(r.RoleMapping, &m); err != nil {
			return IdentityProvider{}, fmt.Errorf("role mapping: %w", err)
		}
	}
	return IdentityProvider{
		TenantID: r.TenantID, Slug: slug, Issuer: r.Issuer, ClientID: r.ClientID,
		ClientSecretSet: len(r.ClientSecretEnc) > 0, RedirectURL: r.RedirectUrl,
		AllowedDomains: r.AllowedDomains, RoleClaim: r.RoleClaim, RoleMapping: m,
		PasswordSignIn: r.PasswordSignIn, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
	}, nil
}

func tenantSlug(ctx context.Context, q *authdb.Queries, tenantID uuid.UUID) (slug, kind string, err error) {
	r, err := q.GetTenantSlugKind(ctx, tenantID)
	return r.Slug, r.Kind, err
}

// GetIdentityProvider returns a tenant's settings (404 when none).
func (s *Service) GetIdentityProvider(ctx context.Context, tenantID uuid.UUID) (IdentityProvider, error) {
	q := authdb.New(db.Querier(ctx, s.pool))
	slug, _, err := tenantSlug(ctx, q, tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return IdentityProvider{}, tenantNotFound()
	}
	if err != nil {
		return IdentityProvider{}, apierr.Internal(err)
	}
	r, err := q.GetIdentityProvider(ctx, tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return IdentityProvider{}, idpNotFound()
	}
	if err != nil {
		return IdentityProvider{}, apierr.Internal(err)
	}
	ip, err := toIdentityProvider(slug, r)
	if err != nil {
		return IdentityProvider{}, apierr.Internal(err)
	}
	return ip, nil
}

func validHTTPURL(field, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" {
		return nil, apierr.Validation(field, "%s must be an absolute http(s) URL", field)
	}
	return u, nil
}

// PutIdentityProvider validates in (the issuer by OpenID discovery, bounded by
// oidcHTTPTimeout), seals the secret and stores the settings, audited.
func (s *Service) PutIdentityProvider(ctx context.Context, tenantID uuid.UUID, in IdentityProviderInput) (IdentityProvider, error) {
	q := authdb.New(db.Querier(ctx, s.pool))
	slug, kind, err := tenantSlug(ctx, q, tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return IdentityProvider{}, tenantNotFound()
	}
	if err != nil {
		return IdentityProvider{}, apierr.Internal(err)
	}
	if kind != "organization" {
		return IdentityProvider{}, apierr.Validation("tenant_id", "only organization tenants can federate")
	}
	if _, err := validHTTPURL("issuer", in.Issuer); err != nil {
		return IdentityProvider{}, err
	}
	if _, err := validHTTPURL("redirect_url", in.RedirectURL); err != nil {
		return IdentityProvider{}, err
	}
	domains := make([]string, 0, len(in.AllowedDomains))
	for _, d := range in.AllowedDomains {
		d = strings.ToLower(strings.TrimSpace(d))
		if d == "" || strings.ContainsAny(d, "@/ ") {
			return IdentityProvider{}, apierr.Validation("allowed_domains", "allowed_domains holds bare domain names")
		}
		domains = append(domains, d)
	}
	for k, v := range in.RoleMapping {
		if v != "admin" && v != "member" {
			return IdentityProvider{}, apierr.Validation("role_mapping", "role_mapping[%q] must be admin or member", k)
		}
	}
	if in.RoleClaim == "" {
		in.RoleClaim = "groups"
	}
	if in.RoleMapping == nil {
		in.RoleMapping = map[string]string{}
	}
	dctx, cancel := context.WithTimeout(oidcContext(ctx), oidcHTTPTimeout)
	defer cancel()
	if _, err := oidc.NewProvider(dctx, in.Issuer); err != nil {
		return IdentityProvider{}, apierr.Validation("issuer", "OpenID discovery of the issuer failed: %v", err).With("reason", "issuer_discovery_failed")
	}
	sealed, err := s.cfg.MasterKey.sealIdPSecret(in.ClientSecret, tenantID)
	if err != nil {
		return IdentityProvider{}, apierr.Internal(err)
	}
	mapping, err := json.Marshal(in.RoleMapping)
	if err != nil {
		return IdentityProvider{}, apierr.Internal(err)
	}
	var row authdb.UpsertIdentityProviderRow
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		row, err = authdb.New(tx).UpsertIdentityProvider(ctx, authdb.UpsertIdentityProviderParams{
			TenantID: tenantID, Issuer: in.Issuer, ClientID: in.ClientID, ClientSecretEnc: sealed,
			RedirectUrl: in.RedirectURL, AllowedDomains: domains, RoleClaim: in.RoleClaim,
			RoleMapping: mapping, PasswordSignIn: in.PasswordSignIn, Now: s.clock.Now(),
		})
		if err != nil {
			return err
		}
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "tenant.identity_provider.update", TargetType: "tenant", TargetID: tenantID.String(), TenantID: tenantID,
			Metadata: map[string]any{"issuer": in.Issuer, "client_id": in.ClientID, "allowed_domains": domains,
				"role_claim": in.RoleClaim, "role_mapping": in.RoleMapping, "password_sign_in": in.PasswordSignIn},
		})
	})
	if err != nil {
		return IdentityProvider{}, apierr.Internal(fmt.Errorf("store identity provider: %w", err))
	}
	return toIdentityProvider(slug, authdb.TenantIdentityProvider{
		TenantID: row.TenantID, Issuer: row.Issuer, ClientID: row.ClientID, ClientSecretEnc: sealed,
		RedirectUrl: row.RedirectUrl, AllowedDomains: row.AllowedDomains, RoleClaim: row.RoleClaim,
		RoleMapping: row.RoleMapping, PasswordSignIn: row.PasswordSignIn, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt,
	})
}

// DeleteIdentityProvider removes a tenant's settings, audited (404 when none).
func (s *Service) DeleteIdentityProvider(ctx context.Context, tenantID uuid.UUID) error {
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		n, err := authdb.New(tx).DeleteIdentityProvider(ctx, tenantID)
		if err != nil {
			return err
		}
		if n == 0 {
			return idpNotFound()
		}
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "tenant.identity_provider.delete", TargetType: "tenant", TargetID: tenantID.String(), TenantID: tenantID,
		})
	})
	if _, ok := apierr.As(err); ok {
		return err
	}
	if err != nil {
		return apierr.Internal(err)
	}
	return nil
}

// oidcClient is what one sign-in needs of a tenant's provider.
type oidcClient struct {
	tenantID uuid.UUID
	settings IdentityProvider
	provider *oidc.Provider
	oauth    oauth2.Config
}

// loadOIDCClient resolves the tenant slug to its provider (discovery included).
func (s *Service) loadOIDCClient(ctx context.Context, slug string) (*oidcClient, error) {
	q := authdb.New(db.Querier(ctx, s.pool))
	t, err := q.GetTenantForSignIn(ctx, slug)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idpNotFound()
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if t.Kind == "personal" {
		return nil, apierr.New(apierr.AuthPersonalRequired, "this is a personal account: sign in with username and password")
	}
	r, err := q.GetIdentityProvider(ctx, t.ID)
	if errors.Is(err, pgx.ErrNoRows) || t.Status != "active" {
		return nil, idpNotFound()
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	settings, err := toIdentityProvider(t.Slug, r)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	secret, err := s.cfg.MasterKey.openIdPSecret(r.ClientSecretEnc, t.ID)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	dctx, cancel := context.WithTimeout(oidcContext(ctx), oidcHTTPTimeout)
	defer cancel()
	p, err := oidc.NewProvider(dctx, r.Issuer)
	if err != nil {
		return nil, apierr.New(apierr.ServiceUnavailable, "the identity provider is unavailable").With("reason", "provider_unavailable").Wrap(err)
	}
	return &oidcClient{
		tenantID: t.ID, settings: settings, provider: p,
		oauth: oauth2.Config{
			ClientID: r.ClientID, ClientSecret: secret, Endpoint: p.Endpoint(), RedirectURL: r.RedirectUrl,
			Scopes: []string{oidc.ScopeOpenID, "email", "profile"},
		},
	}, nil
}

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func hash32(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// OIDCStart is the answer of StartOIDC: where to send the browser and the flow
// cookie's value.
type OIDCStart struct {
	AuthURL   string
	Cookie    string
	MaxAge    time.Duration
	SecureURL bool // the redirect URL is https: the cookie gets Secure
}

// StartOIDC begins an enterprise sign-in of the tenant with slug.
func (s *Service) StartOIDC(ctx context.Context, slug string) (OIDCStart, error) {
	c, err := s.loadOIDCClient(ctx, slug)
	if err != nil {
		return OIDCStart{}, err
	}
	state, err := randomToken()
	if err != nil {
		return OIDCStart{}, apierr.Internal(err)
	}
	nonce, err := randomToken()
	if err != nil {
		return OIDCStart{}, apierr.Internal(err)
	}
	cookie, err := randomToken()
	if err != nil {
		return OIDCStart{}, apierr.Internal(err)
	}
	verifier := oauth2.GenerateVerifier()
	now := s.clock.Now()
	q := authdb.New(db.Querier(ctx, s.pool))
	if err := q.DeleteExpiredOIDCFlows(ctx, now); err != nil {
		return OIDCStart{}, apierr.Internal(err)
	}
	if err := q.InsertOIDCFlow(ctx, authdb.InsertOIDCFlowParams{
		StateHash: hash32(state), CookieHash: hash32(cookie), TenantID: c.tenantID,
		Nonce: nonce, PkceVerifier: verifier, Now: now, ExpiresAt: now.Add(oidcFlowTTL),
	}); err != nil {
		return OIDCStart{}, apierr.Internal(err)
	}
	return OIDCStart{
		AuthURL:   c.oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)),
		Cookie:    cookie,
		MaxAge:    oidcFlowTTL,
		SecureURL: strings.HasPrefix(c.settings.RedirectURL, "https://"),
	}, nil
}

// OIDCCallback is what the provider sent back to the callback.
type OIDCCallback struct {
	State, Code, Error, Cookie string
}

// idTokenVerifier is the one verifier configuration: issuer, audience (client id),
// expiry against the service clock, and the algorithm allow-list.
func idTokenVerifier(issuer string, keys oidc.KeySet, clientID string, now func() time.Time) *oidc.IDTokenVerifier {
	return oidc.NewVerifier(issuer, keys, &oidc.Config{
		ClientID: clientID, SupportedSigningAlgs: oidcSigningAlgs, Now: now,
	})
}

// federatedClaims are the ID-token claims a sign-in uses.
type federatedClaims struct {
	Subject       string
	Email         string
	EmailVerified bool
	Name          string
	Roles         []string // values of the role claim
}

// verifyIDToken checks raw with v and the nonce, and extracts the claims.
func verifyIDToken(ctx context.Context, v *oidc.IDTokenVerifier, raw, nonce, roleClaim string) (federatedClaims, error) {
	tok, err := v.Verify(ctx, raw)
	if err != nil {
		return federatedClaims{}, errSignIn("id_token_invalid", "the ID token was refused").Wrap(err)
	}
	if subtle.ConstantTimeCompare([]byte(tok.Nonce), []byte(nonce)) != 1 {
		return federatedClaims{}, errSignIn("nonce_invalid", "the ID token's nonce does not match this sign-in")
	}
	var all map[string]any
	if err := tok.Claims(&all); err != nil {
		return federatedClaims{}, errSignIn("id_token_invalid", "the ID token's claims cannot be read").Wrap(err)
	}
	c := federatedClaims{Subject: tok.Subject}
	c.Email, _ = all["email"].(string)
	c.Name, _ = all["name"].(string)
	switch ev := all["email_verified"].(type) {
	case bool:
		c.EmailVerified = ev
	case string: // some providers send "true"
		c.EmailVerified = ev == "true"
	}
	switch rv := all[roleClaim].(type) {
	case string:
		c.Roles = []string{rv}
	case []any:
		for _, x := range rv {
			if s, ok := x.(string); ok {
				c.Roles = append(c.Roles, s)
			}
		}
	}
	return c, nil
}

// emailDomainAllowed reports whether email's domain is one of domains (exact match).
func emailDomainAllowed(email string, domains []string) bool {
	at := strings.LastIndexByte(email, '@')
	if at <= 0 || at == len(email)-1 {
		return false
	}
	d := strings.ToLower(email[at+1:])
	for _, a := range domains {
		if d == a {
			return true
		}
	}
	return false
}

// mappedRole is the tenant role the claims give: admin when any value maps to admin.
func mappedRole(mapping map[string]string, values []string) string {
	role := "member"
	for _, v := range values {
		if mapping[v] == "admin" {
			return "admin"
		}
	}
	return role
}

// FinishOIDC completes an enterprise sign-in of the tenant with slug.
func (s *Service) FinishOIDC(ctx context.Context, slug string, cb OIDCCallback) (AuthTokens, error) {
	out, err := s.finishOIDC(ctx, slug, cb)
	if err != nil {
		s.login.failures.Inc()
	}
	return out, err
}

func (s *Service) finishOIDC(ctx context.Context, slug string, cb OIDCCallback) (AuthTokens, error) {
	if cb.State == "" {
		return AuthTokens{}, errSignIn("state_invalid", "the sign-in state is missing")
	}
	// Spend the state first, in its own statement: whatever happens below, it cannot be
	// used again.
	flow, err := authdb.New(db.Querier(ctx, s.pool)).TakeOIDCFlow(ctx, hash32(cb.State))
	if errors.Is(err, pgx.ErrNoRows) {
		return AuthTokens{}, errSignIn("state_invalid", "unknown or already used sign-in state")
	}
	if err != nil {
		return AuthTokens{}, apierr.Internal(err)
	}
	if subtle.ConstantTimeCompare(flow.CookieHash, hash32(cb.Cookie)) != 1 {
		return AuthTokens{}, errSignIn("state_invalid", "the sign-in was started by another browser")
	}
	if !s.clock.Now().Before(flow.ExpiresAt) {
		return AuthTokens{}, errSignIn("state_invalid", "the sign-in took too long; start again")
	}
	c, err := s.loadOIDCClient(ctx, slug)
	if err != nil {
		return AuthTokens{}, err
	}
	if c.tenantID != flow.TenantID {
		return AuthTokens{}, errSignIn("state_invalid", "the sign-in was started for another tenant")
	}
	if cb.Error != "" {
		return AuthTokens{}, errSignIn("provider_error", "the identity provider refused the sign-in").With("provider_error", cb.Error)
	}
	if cb.Code == "" {
		return AuthTokens{}, errSignIn("code_exchange_failed", "the authorization code is missing")
	}
	hctx, cancel := context.WithTimeout(oidcContext(ctx), oidcHTTPTimeout)
	defer cancel()
	tok, err := c.oauth.Exchange(context.WithValue(hctx, oauth2.HTTPClient, oidcHTTP), cb.Code, oauth2.VerifierOption(flow.PkceVerifier))
	if err != nil {
		return AuthTokens{}, errSignIn("code_exchange_failed", "the authorization code was refused by the provider").Wrap(err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return AuthTokens{}, errSignIn("id_token_invalid", "the provider returned no ID token")
	}
	v := c.provider.VerifierContext(hctx, &oidc.Config{ClientID: c.oauth.ClientID, SupportedSigningAlgs: oidcSigningAlgs, Now: s.clock.Now})
	claims, err := verifyIDToken(hctx, v, raw, flow.Nonce, c.settings.RoleClaim)
	if err != nil {
		return AuthTokens{}, err
	}
	if claims.Email == "" || !claims.EmailVerified {
		return AuthTokens{}, errSignIn("email_not_verified", "the provider did not assert a verified email")
	}
	if !emailDomainAllowed(claims.Email, c.settings.AllowedDomains) {
		return AuthTokens{}, errSignIn("email_domain_not_allowed", "this email domain may not sign in to this tenant")
	}
	return s.signInFederated(ctx, c, claims)
}

// signInFederated provisions (or updates) the federated user and issues tokens, in one
// transaction.
func (s *Service) signInFederated(ctx context.Context, c *oidcClient, claims federatedClaims) (AuthTokens, error) {
	role := mappedRole(c.settings.RoleMapping, claims.Roles)
	username := strings.ToLower(claims.Email)
	if len(username) > 64 {
		return AuthTokens{}, errSignIn("email_not_verified", "the email is longer than a username may be")
	}
	display := claims.Name
	if display == "" || len(display) > 120 {
		display = username
	}
	issuer := c.settings.Issuer
	now := s.clock.Now()
	var out AuthTokens
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		var userID uuid.UUID
		action := "user.login"
		fi, err := q.GetFederatedIdentity(ctx, authdb.GetFederatedIdentityParams{Issuer: issuer, Subject: claims.Subject})
		switch {
		case err == nil:
			if fi.TenantID != c.tenantID {
				return apierr.New(apierr.UserAlreadyExists, "this identity belongs to another tenant")
			}
			userID = fi.UserID
			if err := q.SetUserTenantRole(ctx, authdb.SetUserTenantRoleParams{TenantRole: &role, Now: now, ID: userID}); err != nil {
				return err
			}
		case errors.Is(err, pgx.ErrNoRows):
			u, err := q.GetUserForFederation(ctx, username)
			if err == nil {
				if u.PasswordHash != nil {
					return apierr.New(apierr.AuthPersonalRequired, "%s is a personal account: sign in with username and password", username)
				}
				return apierr.New(apierr.UserAlreadyExists, "%s is already linked to another identity", username)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			userID = s.ids.New()
			if err := q.InsertFederatedUser(ctx, authdb.InsertFederatedUserParams{
				ID: userID, Username: username, DisplayName: display,
				TenantID: uuid.NullUUID{UUID: c.tenantID, Valid: true}, TenantRole: &role, Now: now,
			}); err != nil {
				return err
			}
			if err := q.InsertFederatedIdentity(ctx, authdb.InsertFederatedIdentityParams{
				UserID: userID, TenantID: c.tenantID, Issuer: issuer, Subject: claims.Subject, Now: now,
			}); err != nil {
				return err
			}
			action = "user.provision"
		default:
			return err
		}
		family := s.ids.New()
		if out, err = s.issueTx(ctx, tx, userID, family); err != nil {
			return err
		}
		actx := principal.With(ctx, out.Identity.Principal())
		md := map[string]any{"method": "oidc", "issuer": issuer, "tenant_role": role, "family": family.String()}
		if action == "user.provision" {
			if err := s.audit.Record(actx, tx, audit.Entry{
				Action: "user.provision", TargetType: "user", TargetID: userID.String(), TenantID: c.tenantID, Metadata: md,
			}); err != nil {
				return err
			}
		}
		return s.audit.Record(actx, tx, audit.Entry{
			Action: "user.login", TargetType: "user", TargetID: userID.String(), TenantID: c.tenantID, Metadata: md,
		})
	})
	if errors.Is(err, errInactive) {
		return AuthTokens{}, errSignIn("user_disabled", "this user cannot sign in")
	}
	if _, ok := apierr.As(err); ok {
		return AuthTokens{}, err
	}
	if db.IsUniqueViolation(err, "users_username_key") || db.IsUniqueViolation(err, "auth_federated_identities_issuer_subject_key") {
		return AuthTokens{}, apierr.New(apierr.UserAlreadyExists, "a concurrent sign-in provisioned this user; retry").Wrap(err)
	}
	if err != nil {
		return AuthTokens{}, apierr.Internal(fmt.Errorf("federated sign-in: %w", err))
	}
	return out, nil
}

// federatedPasswordSignIn refuses a password sign-in of a federated user (they have no
// password): auth_enterprise_required. Checked before the password, like an unknown
// user's failure it costs the same backoff.
func federatedPasswordSignIn(ctx context.Context, q *authdb.Queries, userID uuid.UUID) error {
	fed, err := q.IsFederatedUser(ctx, userID)
	if err != nil {
		return apierr.Internal(err)
	}
	if fed {
		return apierr.New(apierr.AuthEnterpriseRequired, "this account signs in through its organization's identity provider")
	}
	return nil
}

// errTenantPasswordSignIn refuses a correct password of a user whose tenant turned
// password sign-in off (GetUserByUsername's password_sign_in): auth_personal_disabled.
func errTenantPasswordSignIn() error {
	return apierr.New(apierr.AuthPersonalDisabled, "password sign-in is disabled for this organization; use its identity provider")
}

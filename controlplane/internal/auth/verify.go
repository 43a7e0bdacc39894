package auth

import (
	"context"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
)

const (
	// unknownKidReloadInterval rate-limits the reloads an unknown kid may trigger, so a
	// flood of forged kids costs at most one query per interval.
	unknownKidReloadInterval = 10 * time.Second
	// maxTokenLength matches the contract's limit on access_token.
	maxTokenLength = 8192
)

// Authenticator verifies access tokens. Verification reads only memory; the database
// is touched only when a token names a kid this replica has not seen (at most once per
// unknownKidReloadInterval).
type Authenticator struct {
	keys  *Keyring
	cfg   Config
	clock clock.Clock

	mu         sync.Mutex
	lastReload time.Time

	verified verifiedCache
}

// NewAuthenticator returns an authenticator over keys.
func NewAuthenticator(keys *Keyring, cfg Config, clk clock.Clock) *Authenticator {
	return &Authenticator{keys: keys, cfg: cfg, clock: clk}
}

func errTokenMissing() *apierr.Error {
	return apierr.New(apierr.TokenMissing, "authentication required: send an access token in the Authorization header as a Bearer token")
}

func errTokenInvalid(cause error) *apierr.Error {
	return apierr.New(apierr.TokenInvalid, "access token is invalid").Wrap(cause)
}

func errTokenExpired() *apierr.Error {
	return apierr.New(apierr.TokenExpired, "access token has expired")
}

func errTokenScope() *apierr.Error {
	return apierr.New(apierr.TokenScopeInvalid, "access token is not valid for this API")
}

// errOpaqueScope: a Gantry token of another kind (refresh, node, terminal) was sent as
// the bearer of the REST API.
func errOpaqueScope(kind string) *apierr.Error {
	return apierr.New(apierr.TokenScopeInvalid, "a %s token is not an access token: send the access token as the bearer", kind)
}

// BearerToken is the bearer credential of r's Authorization header. It never looks at
// the query string: an ?access_token= parameter is ignored. found is false when there is
// no bearer; err is token_invalid when the header is ambiguous (sent twice).
func BearerToken(r *http.Request) (token string, found bool, err error) {
	values := r.Header.Values("Authorization")
	if len(values) == 0 {
		return "", false, nil
	}
	if len(values) > 1 {
		return "", false, errTokenInvalid(errors.New("more than one Authorization header"))
	}
	scheme, cred, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false, nil
	}
	cred = strings.TrimSpace(cred)
	if cred == "" {
		return "", false, nil
	}
	return cred, true, nil
}

// Authenticate verifies the request's bearer access token and returns its principal.
// Every error is an *apierr.Error: token_missing, token_invalid, token_expired or
// token_scope_invalid (seed §5 rule 2).
func (a *Authenticator) Authenticate(r *http.Request) (*principal.Principal, error) {
	token, found, err := BearerToken(r)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errTokenMissing()
	}
	return a.Verify(r.Context(), token)
}

// Verify checks an access token: compact RS256 JWS (alg pinned, whatever the header
// says), signed by a published key, our issuer and audience, inside exp/nbf with
// Leeway, scope "api".
func (a *Authenticator) Verify(ctx context.Context, token string) (*principal.Principal, error) {
	now := a.clock.Now()
	if p, ok := a.verified.get(token, now); ok {
		a.markStepUp(p, now)
		return p, nil
	}
	p, exp, err := a.verify(ctx, token)
	if err != nil {
		return nil, err
	}
	a.verified.put(token, p, now, exp)
	out := clonePrincipal(p)
	a.markStepUp(out, now)
	return out, nil
}

// verify checks a token from scratch and also returns its expiry.
func (a *Authenticator) verify(ctx context.Context, token string) (*principal.Principal, time.Time, error) {
	fail := func(err error) (*principal.Principal, time.Time, error) { return nil, time.Time{}, err }
	if len(token) > maxTokenLength {
		return fail(errTokenInvalid(errors.New("token too long")))
	}
	if kind := opaqueTokenKind(token); kind != "" {
		return fail(errOpaqueScope(kind))
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return fail(errTokenInvalid(errors.New("not a compact JWS")))
	}
	hdrJSON, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return fail(errTokenInvalid(fmt.Errorf("header encoding: %w", err)))
	}
	var hdr struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(hdrJSON, &hdr); err != nil {
		return fail(errTokenInvalid(fmt.Errorf("header: %w", err)))
	}
	// Pinned: "none", HS256 (with the public key as secret) and everything else fail here
	// and again in VerifyCompactFast, which checks the header against RS256.
	if hdr.Alg != "RS256" {
		return fail(errTokenInvalid(fmt.Errorf("alg %q", hdr.Alg)))
	}
	pub, err := a.keyFor(ctx, hdr.Kid)
	if err != nil {
		return fail(errTokenInvalid(err))
	}
	payload, err := jws.VerifyCompactFast(pub, []byte(token), jwa.RS256())
	if err != nil {
		return fail(errTokenInvalid(fmt.Errorf("signature: %w", err)))
	}
	var c accessClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		return fail(errTokenInvalid(fmt.Errorf("claims: %w", err)))
	}
	p, err := a.checkClaims(&c)
	if err != nil {
		return fail(err)
	}
	return p, time.Unix(*c.Expiry, 0), nil
}

// checkClaims validates the verified claims and builds the principal.
func (a *Authenticator) checkClaims(c *accessClaims) (*principal.Principal, error) {
	if c.Issuer != a.cfg.Issuer {
		return nil, errTokenInvalid(fmt.Errorf("issuer %q", c.Issuer))
	}
	audOK := false
	for _, aud := range c.Audience {
		audOK = audOK || aud == a.cfg.Audience
	}
	if !audOK {
		return nil, errTokenInvalid(fmt.Errorf("audience %v", []string(c.Audience)))
	}
	if c.Expiry == nil {
		return nil, errTokenInvalid(errors.New("no exp"))
	}
	now := a.clock.Now()
	if !now.Before(time.Unix(*c.Expiry, 0).Add(Leeway)) {
		return nil, errTokenExpired()
	}
	if c.NotBefore != nil && now.Add(Leeway).Before(time.Unix(*c.NotBefore, 0)) {
		return nil, errTokenInvalid(errors.New("not yet valid (nbf)"))
	}
	if c.IssuedAt != nil && now.Add(Leeway).Before(time.Unix(*c.IssuedAt, 0)) {
		return nil, errTokenInvalid(errors.New("issued in the future (iat)"))
	}
	if c.Scope != ScopeAPI {
		return nil, errTokenScope()
	}
	userID, err := uuid.Parse(c.Subject)
	if err != nil {
		return nil, errTokenInvalid(fmt.Errorf("sub: %w", err))
	}
	ident := Identity{
		UserID: userID, Username: c.Username, TenantRole: c.TenantRole,
		PlatformRoles: c.PlatformRoles, RoleSource: c.RoleSource,
	}
	amr, authTime, err := proofClaims(c)
	if err != nil {
		return nil, errTokenInvalid(err)
	}
	if c.TenantID != "" {
		if ident.TenantID, err = uuid.Parse(c.TenantID); err != nil {
			return nil, errTokenInvalid(fmt.Errorf("tid: %w", err))
		}
	}
	if ident.PlatformRoles == nil {
		ident.PlatformRoles = []string{}
	}
	if ident.RoleSource != principal.RoleSourceUsers && ident.RoleSource != principal.RoleSourceBindings {
		return nil, errTokenInvalid(fmt.Errorf("psrc %q", ident.RoleSource))
	}
	p := ident.Principal()
	p.AMR, p.AuthTime = amr, authTime
	if c.Machine != nil {
		if p.Machine, err = c.Machine.machine(); err != nil {
			return nil, errTokenInvalid(err)
		}
		if len(amr) > 0 || ident.TenantRole != "" || len(p.Capabilities) > 0 || ident.TenantID == uuid.Nil {
			return nil, errTokenInvalid(errors.New("machine token with a human's claims"))
		}
	}
	return p, nil
}

// keyFor finds the published key kid names. An unknown kid (a key another replica has
// just created) reloads the set, at most once per unknownKidReloadInterval.
func (a *Authenticator) keyFor(ctx context.Context, kid string) (*rsa.PublicKey, error) {
	now := a.clock.Now()
	if pub, ok := a.keys.verificationKey(kid, now); ok {
		return pub, nil
	}
	if _, err := uuid.Parse(kid); err != nil {
		return nil, fmt.Errorf("kid %q is not one of ours", kid)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Another request may have reloaded while this one waited.
	if pub, ok := a.keys.verificationKey(kid, now); ok {
		return pub, nil
	}
	if !a.lastReload.IsZero() && now.Sub(a.lastReload) < unknownKidReloadInterval {
		return nil, fmt.Errorf("unknown kid %q (reload rate-limited)", kid)
	}
	a.lastReload = now
	if err := a.keys.Reload(ctx); err != nil {
		return nil, fmt.Errorf("reload for kid %q: %w", kid, err)
	}
	if pub, ok := a.keys.verificationKey(kid, now); ok {
		return pub, nil
	}
	return nil, fmt.Errorf("unknown kid %q", kid)
}

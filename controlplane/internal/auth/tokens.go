package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// ScopeAPI is the scope of access tokens for the REST API. Tokens minted for other
// uses (terminal sessions, ...) carry another scope and are refused by Authenticate.
const ScopeAPI = "api"

// Identity is what the database says about a user when tokens are issued: exactly the
// facts an access token carries, so no request needs a database read to know them.
type Identity struct {
	UserID   uuid.UUID
	Username string
	// Role is users.role ("user" or "admin").
	Role string
	// TenantID is uuid.Nil for a user outside any tenant; TenantRole is then "".
	TenantID      uuid.UUID
	TenantRole    string
	PlatformRoles []string
	// RoleSource is principal.RoleSourceUsers or principal.RoleSourceBindings.
	RoleSource string
}

// Principal is the authenticated caller these facts describe.
func (id Identity) Principal() *principal.Principal {
	return &principal.Principal{
		UserID:       id.UserID,
		Username:     id.Username,
		TenantID:     id.TenantID,
		TenantRole:   id.TenantRole,
		PlatformRole: id.PlatformRoles,
		RoleSource:   id.RoleSource,
		Capabilities: principal.CapabilitiesFor(id.PlatformRoles),
	}
}

// AuthTokens is the result of a sign-in or a refresh.
type AuthTokens struct {
	AccessToken      string
	AccessExpiresAt  time.Time
	RefreshToken     string
	RefreshExpiresAt time.Time
	Identity         Identity
}

// accessClaims is the payload of an access token.
type accessClaims struct {
	Issuer    string   `json:"iss"`
	Audience  audience `json:"aud"`
	Subject   string   `json:"sub"`
	IssuedAt  *int64   `json:"iat"`
	NotBefore *int64   `json:"nbf"`
	Expiry    *int64   `json:"exp"`
	JWTID     string   `json:"jti"`
	Scope     string   `json:"scope"`

	Username      string   `json:"un"`
	TenantID      string   `json:"tid,omitempty"`
	TenantRole    string   `json:"trole,omitempty"`
	PlatformRoles []string `json:"proles"`
	RoleSource    string   `json:"psrc"`

	// Set only on step-up tokens, after a TOTP code was verified (stepup.go).
	AMR      []string `json:"amr,omitempty"`
	AuthTime *int64   `json:"auth_time,omitempty"`

	// Set only on machine tokens from the client-credentials grant (machine.go).
	Machine *machineClaims `json:"mach,omitempty"`
}

// audience is the aud claim: one string when issued; a string or an array when read.
type audience []string

func (a audience) MarshalJSON() ([]byte, error) {
	if len(a) == 1 {
		return json.Marshal(a[0])
	}
	return json.Marshal([]string(a))
}

func (a *audience) UnmarshalJSON(b []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte(`"`)) {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*a = audience{s}
		return nil
	}
	var ss []string
	if err := json.Unmarshal(b, &ss); err != nil {
		return err
	}
	*a = ss
	return nil
}

// Service issues and rotates tokens: sign-in, refresh, logout.
type Service struct {
	pool  *pgxpool.Pool
	cfg   Config
	keys  *Keyring
	clock clock.Clock
	ids   ids.Source
	audit *audit.Log
	login loginMetrics
	roles roleMetrics
}

// NewService returns the token service.
func NewService(pool *pgxpool.Pool, cfg Config, keys *Keyring, clk clock.Clock, idSrc ids.Source) *Service {
	return &Service{pool: pool, cfg: cfg, keys: keys, clock: clk, ids: idSrc, audit: &audit.Log{Clock: clk, IDs: idSrc}, login: newLoginMetrics(), roles: newRoleMetrics()}
}

// errInvalidCredentials is the one answer to every failed sign-in: unknown user, wrong
// password, no password, disabled user or tenant.
func errInvalidCredentials() *apierr.Error {
	return apierr.New(apierr.TokenInvalid, "invalid username or password")
}

// errInactive: the user (or its tenant) is disabled.
var errInactive = errors.New("auth: user or tenant is not active")

// IssueFor signs in userID without a password (tests, dev seeding, sign-up): a new
// refresh-token family and an access token.
func (s *Service) IssueFor(ctx context.Context, userID uuid.UUID) (AuthTokens, error) {
	var out AuthTokens
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = s.issueTx(ctx, tx, userID, s.ids.New())
		return err
	})
	if errors.Is(err, errInactive) || errors.Is(err, pgx.ErrNoRows) {
		return AuthTokens{}, apierr.New(apierr.TokenInvalid, "user cannot sign in").Wrap(err)
	}
	return out, err
}

// Login checks a username and password and signs the user in. The username's failure
// backoff (throttle.go) is charged first: a locked username is refused 429 before any
// lookup, for known and unknown usernames alike.
func (s *Service) Login(ctx context.Context, username, password string) (AuthTokens, error) {
	return s.LoginWith(ctx, username, password, SecondFactor{})
}

// LoginWith is Login with the second factor a user with active TOTP must present
// (mfa.go). A wrong or missing one fails like a wrong password (401 token_invalid, with
// details.reason) and stays charged to the username's backoff.
func (s *Service) LoginWith(ctx context.Context, username, password string, sf SecondFactor) (AuthTokens, error) {
	key := usernameKey(username)
	if err := s.chargeLoginAttempt(ctx, key); err != nil {
		return AuthTokens{}, err
	}
	fail := func() (AuthTokens, error) {
		s.login.failures.Inc()
		return AuthTokens{}, errInvalidCredentials()
	}
	row, err := authdb.New(db.Querier(ctx, s.pool)).GetUserByUsername(ctx, username)
	if errors.Is(err, pgx.ErrNoRows) {
		CheckPassword(password, nil) // same work as a real check
		return fail()
	}
	if err != nil {
		return AuthTokens{}, apierr.Internal(fmt.Errorf("login lookup: %w", err))
	}
	if row.PasswordHash == nil {
		if err := federatedPasswordSignIn(ctx, authdb.New(db.Querier(ctx, s.pool)), row.ID); err != nil {
			s.login.failures.Inc()
			return AuthTokens{}, err
		}
	}
	if !CheckPassword(password, row.PasswordHash) || !isActive(row.Status, row.TenantStatus) {
		return fail()
	}
	// Sign-in mode (oidc.go): only after the password, so it reveals nothing to a guesser.
	if !row.PasswordSignIn {
		s.login.failures.Inc()
		return AuthTokens{}, errTenantPasswordSignIn()
	}
	var out AuthTokens
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		mfaMethod, err := s.checkSecondFactor(ctx, tx, row.ID, sf)
		if err != nil {
			return err
		}
		family := s.ids.New()
		if out, err = s.issueTx(ctx, tx, row.ID, family); err != nil {
			return err
		}
		if err := clearLoginThrottle(ctx, tx, key); err != nil {
			return err
		}
		// The user is the actor of their own sign-in.
		actx := principal.With(ctx, out.Identity.Principal())
		return s.audit.Record(actx, tx, audit.Entry{
			Action: "user.login", TargetType: "user", TargetID: row.ID.String(),
			TenantID: out.Identity.TenantID,
			Metadata: loginMetadata(family, mfaMethod),
		})
	})
	if errors.Is(err, errInactive) {
		return fail()
	}
	var sfe secondFactorError
	if errors.As(err, &sfe) {
		s.login.failures.Inc()
		return AuthTokens{}, sfe.e
	}
	if err != nil {
		return AuthTokens{}, err
	}
	return out, nil
}

// issueTx loads the user's facts with tx, stores a new refresh token of family and
// signs an access token. errInactive when the user or its tenant is disabled.
func (s *Service) issueTx(ctx context.Context, tx pgx.Tx, userID, family uuid.UUID) (AuthTokens, error) {
	q := authdb.New(tx)
	ident, err := loadIdentity(ctx, q, userID)
	if err != nil {
		return AuthTokens{}, err
	}
	refresh, refreshExp, err := s.insertRefreshToken(ctx, q, userID, family)
	if err != nil {
		return AuthTokens{}, err
	}
	// Signed through tx: a stale key set is read on this transaction's connection.
	access, accessExp, err := s.signAccessWith(ctx, q, ident, nil)
	if err != nil {
		return AuthTokens{}, err
	}
	return AuthTokens{
		AccessToken: access, AccessExpiresAt: accessExp,
		RefreshToken: refresh, RefreshExpiresAt: refreshExp,
		Identity: ident,
	}, nil
}

// loadIdentity reads the facts of userID. Platform roles are the user's bindings
// (platformroles.go), platform_user when none; source bindings.
func loadIdentity(ctx context.Context, q *authdb.Queries, userID uuid.UUID) (Identity, error) {
	u, err := q.GetUserByID(ctx, userID)
	if err != nil {
		return Identity{}, fmt.Errorf("load user %s: %w", userID, err)
	}
	if !isActive(u.Status, u.TenantStatus) {
		return Identity{}, errInactive
	}
	id := Identity{UserID: u.ID, Username: u.Username, Role: u.Role}
	if u.TenantID.Valid {
		id.TenantID = u.TenantID.UUID
		if u.TenantRole != nil {
			id.TenantRole = *u.TenantRole
		}
	}
	roles, err := q.ListPlatformRoleBindings(ctx, userID)
	if err != nil {
		return Identity{}, fmt.Errorf("platform role bindings: %w", err)
	}
	if len(roles) == 0 {
		roles = []string{principal.RoleUser}
	}
	id.PlatformRoles, id.RoleSource = roles, principal.RoleSourceBindings
	return id, nil
}

func isActive(userStatus string, tenantStatus *string) bool {
	return userStatus == "active" && (tenantStatus == nil || *tenantStatus == "active")
}

// signAccess signs an access token for ident with the active key.
func (s *Service) signAccess(ctx context.Context, ident Identity) (string, time.Time, error) {
	return s.signAccessWith(ctx, nil, ident, nil)
}

// signAccessWith signs an access token; proof, when not nil, adds amr and auth_time
// (only stepup.go passes one, after verifying a code).
// q, when not nil, is the caller's transaction (a stale key set is read through it).
func (s *Service) signAccessWith(ctx context.Context, q *authdb.Queries, ident Identity, proof *mfaProof) (string, time.Time, error) {
	claims := accessClaims{
		Subject:  ident.UserID.String(),
		Username: ident.Username, TenantRole: ident.TenantRole,
		PlatformRoles: ident.PlatformRoles, RoleSource: ident.RoleSource,
	}
	if ident.TenantID != uuid.Nil {
		claims.TenantID = ident.TenantID.String()
	}
	if proof != nil {
		at := proof.authTime.Unix()
		claims.AMR, claims.AuthTime = proof.amr, &at
	}
	return s.signTokenWith(ctx, q, claims, s.cfg.AccessTokenTTL)
}

// signToken fills in what every access token carries (issuer, audience, scope, times,
// a fresh jti) for ttl and signs claims with the active key.
func (s *Service) signToken(ctx context.Context, claims accessClaims, ttl time.Duration) (string, time.Time, error) {
	return s.signTokenWith(ctx, nil, claims, ttl)
}

// signTokenWith is signToken reading a stale key set through q (nil: the pool).
func (s *Service) signTokenWith(ctx context.Context, q *authdb.Queries, claims accessClaims, ttl time.Duration) (string, time.Time, error) {
	key, err := s.keys.signerWith(ctx, q)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("access token: %w", err)
	}
	now := s.clock.Now().Truncate(time.Second)
	exp := now.Add(ttl)
	iat, expUnix := now.Unix(), exp.Unix()
	claims.Issuer, claims.Audience, claims.Scope = s.cfg.Issuer, audience{s.cfg.Audience}, ScopeAPI
	claims.IssuedAt, claims.NotBefore, claims.Expiry, claims.JWTID = &iat, &iat, &expUnix, s.ids.New().String()
	token, err := signClaims(key, claims)
	if err != nil {
		return "", time.Time{}, err
	}
	return token, exp, nil
}

// signClaims serializes claims into a compact RS256 JWS with kid and typ JWT.
func signClaims(key *activeKey, claims any) (string, error) {
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("access token claims: %w", err)
	}
	hdr := jws.NewHeaders()
	if err := hdr.Set(jws.KeyIDKey, key.kid); err != nil {
		return "", err
	}
	if err := hdr.Set(jws.TypeKey, "JWT"); err != nil {
		return "", err
	}
	signed, err := jws.Sign(payload, jws.WithKey(jwa.RS256(), key.priv, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		return "", fmt.Errorf("sign access token: %w", err)
	}
	return string(signed), nil
}

func loginMetadata(family uuid.UUID, mfaMethod string) map[string]any {
	m := map[string]any{"method": "password", "family_id": family.String()}
	if mfaMethod != "" {
		m["second_factor"] = mfaMethod
	}
	return m
}

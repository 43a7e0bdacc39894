package machineid

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/machineid/machineiddb"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
)

// The client-credentials grant (RFC 6749 §4.4). Its errors are RFC 6749 §5.2 errors,
// not the envelope: OAuth clients parse exactly these.
const (
	ErrInvalidRequest       = "invalid_request"
	ErrInvalidClient        = "invalid_client"
	ErrUnsupportedGrantType = "unsupported_grant_type"
	ErrInvalidScope         = "invalid_scope"
)

// GrantError is a refused grant: Code is the RFC 6749 error, Status its HTTP status.
type GrantError struct {
	Code        string
	Description string
	Status      int
	RetryAfter  time.Duration
	cause       error
}

func (e *GrantError) Error() string { return e.Code + ": " + e.Description }
func (e *GrantError) Unwrap() error { return e.cause }

func grantErr(status int, code, desc string) *GrantError {
	return &GrantError{Code: code, Description: desc, Status: status}
}

// invalidClient is the one answer for an unknown client id, a wrong secret, and an
// expired, revoked or orphaned credential, so the answer tells a guesser nothing.
func invalidClient() *GrantError {
	return grantErr(http.StatusUnauthorized, ErrInvalidClient, "client authentication failed")
}

// Token is a granted machine access token.
type Token struct {
	AccessToken string
	ExpiresIn   int
	Scope       string
}

// GrantRequest is the grant's input, as read from the HTTP request.
type GrantRequest struct {
	GrantType, ClientID, ClientSecret, Scope string
}

// ReadGrantRequest reads the form body (never the query string) and the Basic header.
// The client authenticates in the body or with Basic, not both (RFC 6749 §2.3).
func ReadGrantRequest(r *http.Request) (GrantRequest, *GrantError) {
	if err := r.ParseForm(); err != nil {
		return GrantRequest{}, grantErr(http.StatusBadRequest, ErrInvalidRequest, "the body is not a form")
	}
	form := r.PostForm
	for _, k := range []string{"grant_type", "client_id", "client_secret", "scope"} {
		if len(form[k]) > 1 { // RFC 6749 §3.2: parameters must not repeat
			return GrantRequest{}, grantErr(http.StatusBadRequest, ErrInvalidRequest, k+" is repeated")
		}
	}
	g := GrantRequest{GrantType: form.Get("grant_type"), ClientID: form.Get("client_id"), ClientSecret: form.Get("client_secret"), Scope: form.Get("scope")}
	if user, pass, ok := r.BasicAuth(); ok {
		if g.ClientID != "" || g.ClientSecret != "" {
			return GrantRequest{}, grantErr(http.StatusBadRequest, ErrInvalidRequest, "send the client credentials in the body or with Basic, not both")
		}
		// RFC 6749 §2.3.1: both are form-urlencoded before Basic encoding.
		var err1, err2 error
		g.ClientID, err1 = url.QueryUnescape(user)
		g.ClientSecret, err2 = url.QueryUnescape(pass)
		if err1 != nil || err2 != nil {
			return GrantRequest{}, grantErr(http.StatusBadRequest, ErrInvalidRequest, "the Basic credentials are not form-encoded")
		}
	}
	return g, nil
}

// Grant checks the client credentials and issues a machine access token.
//
// Order: the request's shape (grant type, scope) first, then the client id's failure
// backoff (read; a failure is charged after the compare: auth/machine.go says why), then
// one lookup, a constant-time compare of SHA-256 hashes (an unknown client id compares
// against a dummy hash, so it costs the same), then the credential's state. Nothing is
// written on failure but the backoff counter; a success writes last_used_at at most once
// a minute.
func (s *Service) Grant(ctx context.Context, g GrantRequest) (Token, error) {
	switch {
	case g.GrantType == "":
		return Token{}, grantErr(http.StatusBadRequest, ErrInvalidRequest, "grant_type is required")
	case g.GrantType != "client_credentials":
		return Token{}, grantErr(http.StatusBadRequest, ErrUnsupportedGrantType, "only client_credentials is supported")
	case g.ClientID == "" || g.ClientSecret == "":
		return Token{}, invalidClientMissing()
	}
	for _, sc := range strings.Fields(g.Scope) {
		if sc != auth.ScopeAPI {
			return Token{}, grantErr(http.StatusBadRequest, ErrInvalidScope, "the only scope is api")
		}
	}
	if len(g.ClientID) > 64 || len(g.ClientSecret) > 128 {
		return Token{}, invalidClient()
	}
	lockedFor, hasFailures, err := s.tokens.ClientThrottle(ctx, g.ClientID)
	if err != nil {
		return Token{}, err
	}
	if lockedFor > 0 {
		return Token{}, errLocked(lockedFor)
	}
	q := machineiddb.New(db.Querier(ctx, s.pool))
	c, err := q.CredentialForGrant(ctx, g.ClientID)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Token{}, fmt.Errorf("credential lookup: %w", err)
	}
	stored := dummyHash[:]
	if err == nil {
		stored = c.SecretHash
	}
	presented := sha256.Sum256([]byte(g.ClientSecret))
	if subtle.ConstantTimeCompare(presented[:], stored) != 1 || err != nil {
		return Token{}, s.failed(ctx, g.ClientID)
	}
	now := s.clock.Now()
	if c.RevokedAt != nil || (c.ExpiresAt != nil && !now.Before(*c.ExpiresAt)) || c.TenantStatus != "active" ||
		c.ServiceAccountDeleted || c.ProjectDeleted {
		return Token{}, invalidClient()
	}
	grant := auth.MachineGrant{UserID: c.UserID, Username: c.Username, TenantID: c.TenantID,
		Machine: principal.Machine{Kind: c.Kind, CredentialID: c.ID, Projects: map[uuid.UUID]string{}}}
	switch c.Kind {
	case principal.MachineServiceAccount:
		grant.Machine.ServiceAccountID = c.ServiceAccountID.UUID
		roles, err := q.ListServiceAccountProjectRoles(ctx, []uuid.UUID{c.ServiceAccountID.UUID})
		if err != nil {
			return Token{}, err
		}
		for _, r := range roles {
			grant.Machine.Projects[r.ProjectID] = r.Role
		}
	case principal.MachineProjectCredential:
		grant.Machine.Projects[c.ProjectID.UUID] = *c.ProjectRole
	}
	token, exp, err := s.tokens.SignMachineAccess(ctx, grant)
	if err != nil {
		return Token{}, err
	}
	// last_used_at to the minute: most grants of a busy client write nothing.
	if c.LastUsedAt == nil || now.Sub(*c.LastUsedAt) >= time.Minute {
		if err := q.TouchCredential(ctx, machineiddb.TouchCredentialParams{Now: &now, ID: c.ID}); err != nil {
			return Token{}, err
		}
	}
	if hasFailures {
		if err := s.tokens.ForgetClientFailures(ctx, g.ClientID); err != nil {
			return Token{}, err
		}
	}
	return Token{AccessToken: token, ExpiresIn: int(exp.Sub(now.Truncate(time.Second)) / time.Second), Scope: auth.ScopeAPI}, nil
}

// failed charges a wrong secret (or unknown client id) to the client id's backoff.
func (s *Service) failed(ctx context.Context, clientID string) error {
	err := s.tokens.ChargeClientFailure(ctx, clientID)
	var locked *auth.ErrClientLocked
	if errors.As(err, &locked) {
		return errLocked(locked.RetryAfter)
	}
	if err != nil {
		return err
	}
	return invalidClient()
}

func errLocked(d time.Duration) *GrantError {
	e := grantErr(http.StatusTooManyRequests, ErrInvalidClient, "too many failed attempts for this client; retry later")
	e.RetryAfter = d
	return e
}

// invalidClientMissing: no client authentication at all (RFC 6749 §5.2 says
// invalid_client; the grant answers 401 with a Basic challenge).
func invalidClientMissing() *GrantError {
	return grantErr(http.StatusUnauthorized, ErrInvalidClient, "client authentication is required: client_id and client_secret, or HTTP Basic")
}

// dummyHash is compared against when the client id is unknown.
var dummyHash = sha256.Sum256([]byte("gantry: no such client"))

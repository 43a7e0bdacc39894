package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

type presentedBearerKey struct{}

// WithPresentedBearer returns ctx carrying the bearer credential of r's Authorization
// header (if any), for operations that check an opaque token themselves rather than
// through Authenticate: POST /internal/auth/jwks/refresh (security internalTokenAuth).
func WithPresentedBearer(ctx context.Context, r *http.Request) context.Context {
	token, found, err := BearerToken(r)
	if err != nil || !found {
		return ctx
	}
	return context.WithValue(ctx, presentedBearerKey{}, token)
}

func presentedBearer(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(presentedBearerKey{}).(string)
	return t, ok && t != ""
}

// errJWKSRefreshDisabled: the internal refresh is off, so the route does not exist.
func errJWKSRefreshDisabled() *apierr.Error {
	return &apierr.Error{Code: apierr.InvalidRequest, Message: "not found", Status: http.StatusNotFound}
}

// checkInternalRefreshToken authorizes an internal JWKS refresh. The comparison is of
// SHA-256 digests in constant time, so neither the content nor the length of the
// configured token leaks through timing.
func (c Config) checkInternalRefreshToken(ctx context.Context) error {
	if c.InternalJWKSRefreshToken == "" {
		return errJWKSRefreshDisabled()
	}
	presented, ok := presentedBearer(ctx)
	if !ok {
		return apierr.New(apierr.TokenInvalid, "internal token is missing or wrong")
	}
	want := sha256.Sum256([]byte(c.InternalJWKSRefreshToken))
	got := sha256.Sum256([]byte(presented))
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return apierr.New(apierr.TokenInvalid, "internal token is missing or wrong")
	}
	return nil
}

// RefreshJWKS forces a reload of the published key set (what POST
// /internal/auth/jwks/refresh does) and returns how many keys are published.
func (k *Keyring) RefreshJWKS(ctx context.Context) (int, error) {
	if err := k.Reload(ctx); err != nil {
		return 0, err
	}
	keys, err := k.PublicKeys(ctx)
	return len(keys), err
}

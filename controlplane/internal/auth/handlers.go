package auth

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// TenantProvisioner creates a personal tenant with its first user (the tenant admin)
// inside tx and returns the user's id. Tenancy implements it; it hashes the password
// with HashPassword and answers user_already_exists (409) for a taken username.
type TenantProvisioner interface {
	ProvisionPersonal(ctx context.Context, tx pgx.Tx, username, password, displayName, orgName string) (userID uuid.UUID, err error)
}

// Handlers implements the Auth operations of api.StrictServerInterface: Signup, Login,
// RefreshToken, Logout, GetJWKS, RefreshJWKS. Errors are returned as *apierr.Error for
// the server's one error mapper; handlers never write errors themselves.
type Handlers struct {
	svc         *Service
	keys        *Keyring
	cfg         Config
	provisioner TenantProvisioner
	cursors     pagination.Codec // WithCursors (admin user lists)
}

// NewHandlers returns the auth handlers.
func NewHandlers(svc *Service, keys *Keyring, cfg Config, provisioner TenantProvisioner) *Handlers {
	return &Handlers{svc: svc, keys: keys, cfg: cfg, provisioner: provisioner}
}

// StrictMiddleware is an api.StrictMiddlewareFunc: for RefreshJWKS it puts the request's
// bearer on the context (WithPresentedBearer), since the strict request object carries
// no Authorization header. Mount it in api.NewStrictHandlerWithOptions.
func (h *Handlers) StrictMiddleware(f api.StrictHandlerFunc, operationID string) api.StrictHandlerFunc {
	if operationID != "RefreshJWKS" {
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		return f(WithPresentedBearer(ctx, r), w, r, request)
	}
}

// Signup creates a personal tenant and signs its first user in.
func (h *Handlers) Signup(ctx context.Context, req api.SignupRequestObject) (api.SignupResponseObject, error) {
	if !h.cfg.PersonalSignup {
		return nil, apierr.New(apierr.AuthPersonalDisabled, "personal sign-up is disabled on this platform")
	}
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	b := req.Body
	displayName := b.Username
	if b.DisplayName != nil {
		displayName = *b.DisplayName
	}
	tokens, err := h.svc.SignupPersonal(ctx, h.provisioner, b.Username, b.Password, displayName, b.OrganizationName)
	if err != nil {
		return nil, err
	}
	return api.Signup201JSONResponse{Body: tokenResponse(tokens, h.cfg), Headers: api.Signup201ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// Login signs a user in with username and password.
func (h *Handlers) Login(ctx context.Context, req api.LoginRequestObject) (api.LoginResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	sf := SecondFactor{}
	if req.Body.TotpCode != nil {
		sf.TOTPCode = *req.Body.TotpCode
	}
	if req.Body.RecoveryCode != nil {
		sf.RecoveryCode = *req.Body.RecoveryCode
	}
	tokens, err := h.svc.LoginWith(ctx, req.Body.Username, req.Body.Password, sf)
	if err != nil {
		return nil, err
	}
	return api.Login200JSONResponse{Body: tokenResponse(tokens, h.cfg), Headers: api.Login200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// RefreshToken rotates a refresh token.
func (h *Handlers) RefreshToken(ctx context.Context, req api.RefreshTokenRequestObject) (api.RefreshTokenResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	tokens, err := h.svc.Refresh(ctx, req.Body.RefreshToken)
	if err != nil {
		return nil, err
	}
	return api.RefreshToken200JSONResponse{Body: tokenResponse(tokens, h.cfg), Headers: api.RefreshToken200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// Logout revokes the family of a refresh token (204 also when nothing was revoked).
func (h *Handlers) Logout(ctx context.Context, req api.LogoutRequestObject) (api.LogoutResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	if err := h.svc.Logout(ctx, req.Body.RefreshToken); err != nil {
		return nil, err
	}
	return api.Logout204Response{Headers: api.Logout204ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// GetJWKS publishes the signing keys.
func (h *Handlers) GetJWKS(ctx context.Context, _ api.GetJWKSRequestObject) (api.GetJWKSResponseObject, error) {
	keys, err := h.keys.PublicKeys(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return api.GetJWKS200JSONResponse{Body: api.JWKSet{Keys: keys}, Headers: api.GetJWKS200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// RefreshJWKS forces this replica to reload the signing-key set. It exists only when
// INTERNAL_JWKS_REFRESH_TOKEN is set (else 404), and wants that token as bearer.
func (h *Handlers) RefreshJWKS(ctx context.Context, _ api.RefreshJWKSRequestObject) (api.RefreshJWKSResponseObject, error) {
	if err := h.cfg.checkInternalRefreshToken(ctx); err != nil {
		return nil, err
	}
	n, err := h.keys.RefreshJWKS(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return api.RefreshJWKS200JSONResponse{Body: api.JWKSRefreshResponse{Ok: true, KeyCount: n}, Headers: api.RefreshJWKS200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// SignupPersonal provisions a personal tenant through p and signs its first user in,
// all in one transaction: either the tenant, the user and the session exist, or none.
func (s *Service) SignupPersonal(ctx context.Context, p TenantProvisioner, username, password, displayName, orgName string) (AuthTokens, error) {
	if p == nil {
		return AuthTokens{}, apierr.New(apierr.ServiceUnavailable, "sign-up is not available")
	}
	if err := ValidatePassword(password); err != nil {
		return AuthTokens{}, err
	}
	var out AuthTokens
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		userID, err := p.ProvisionPersonal(ctx, tx, username, password, displayName, orgName)
		if err != nil {
			return err
		}
		out, err = s.issueTx(ctx, tx, userID, s.ids.New())
		return err
	})
	if err != nil {
		if _, ok := apierr.As(err); ok {
			return AuthTokens{}, err
		}
		if db.IsUniqueViolation(err, "users_username_key") {
			return AuthTokens{}, apierr.New(apierr.UserAlreadyExists, "username is taken").Wrap(err)
		}
		return AuthTokens{}, apierr.Internal(fmt.Errorf("sign-up: %w", err))
	}
	return out, nil
}

func tokenResponse(t AuthTokens, cfg Config) api.AuthTokenResponse {
	return api.AuthTokenResponse{
		AccessToken:      t.AccessToken,
		TokenType:        api.AuthTokenResponseTokenTypeBearer,
		ExpiresIn:        int(cfg.AccessTokenTTL.Seconds()),
		RefreshToken:     t.RefreshToken,
		RefreshExpiresIn: int(cfg.RefreshTokenTTL.Seconds()),
		User:             api.User{ID: t.Identity.UserID, Username: t.Identity.Username, Role: api.UserRole(t.Identity.Role)},
	}
}

func requestID(ctx context.Context) *string {
	if id := correlation.ID(ctx); id != "" {
		return &id
	}
	return nil
}

// Compile-time check that the handlers have the generated signatures.
var _ interface {
	Signup(context.Context, api.SignupRequestObject) (api.SignupResponseObject, error)
	Login(context.Context, api.LoginRequestObject) (api.LoginResponseObject, error)
	RefreshToken(context.Context, api.RefreshTokenRequestObject) (api.RefreshTokenResponseObject, error)
	Logout(context.Context, api.LogoutRequestObject) (api.LogoutResponseObject, error)
	GetJWKS(context.Context, api.GetJWKSRequestObject) (api.GetJWKSResponseObject, error)
	RefreshJWKS(context.Context, api.RefreshJWKSRequestObject) (api.RefreshJWKSResponseObject, error)
} = (*Handlers)(nil)

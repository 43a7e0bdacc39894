package auth

import (
	"context"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// The MFA and step-up operations (docs/api.md, "MFA and step-up"). Who may call them is
// declared in the authorization table (account security: any authenticated user;
// mfa-readiness: platform.ops.read); the handlers check the caller again where the
// answer depends on it.

// StepUp answers POST /api/v1/auth/step-up.
func (h *Handlers) StepUp(ctx context.Context, req api.StepUpRequestObject) (api.StepUpResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	t, err := h.svc.StepUp(ctx, req.Body.TotpCode)
	if err != nil {
		return nil, err
	}
	amr := make([]api.StepUpResponseAmr, len(t.AMR))
	for i, m := range t.AMR {
		amr[i] = api.StepUpResponseAmr(m)
	}
	return api.StepUp200JSONResponse{Body: api.StepUpResponse{
		AccessToken: t.AccessToken, TokenType: api.StepUpResponseTokenTypeBearer,
		ExpiresIn: int(h.cfg.AccessTokenTTL.Seconds()), Amr: amr, AuthTime: t.AuthTime.UTC(),
		StepUpExpiresIn: int(t.Window.Seconds()),
	}, Headers: api.StepUp200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// GetAccountSecurity answers GET /api/v1/account/security.
func (h *Handlers) GetAccountSecurity(ctx context.Context, _ api.GetAccountSecurityRequestObject) (api.GetAccountSecurityResponseObject, error) {
	p, err := humanUser(ctx)
	if err != nil {
		return nil, err
	}
	st, err := h.svc.Posture(ctx, p.UserID)
	if err != nil {
		return nil, err
	}
	var body api.AccountSecurityResponse
	body.UserID = p.UserID
	body.Mfa.Enabled = st.State == "active"
	body.Mfa.State = api.AccountSecurityResponseMfaState(st.State)
	body.Mfa.Factors = factorsOf(st)
	body.Mfa.RecoveryCodesRemaining = st.RecoveryCodesRemaining
	body.Sessions.Active = st.ActiveSessions
	body.StepUp.Satisfied = RequireStepUp(ctx) == nil
	body.StepUp.WindowSeconds = int(h.cfg.stepUpWindow().Seconds())
	return api.GetAccountSecurity200JSONResponse{Body: body, Headers: api.GetAccountSecurity200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// factorsOf lists the factor(s) of a posture: the active one and a pending replacement.
func factorsOf(st MFAState) []api.MFAFactor {
	out := []api.MFAFactor{}
	if st.ActivatedAt != nil {
		out = append(out, api.MFAFactor{Type: api.MFAFactorTypeTotp, State: api.MFAFactorStateActive, CreatedAt: st.ActivatedAt.UTC(), ActivatedAt: ptr(st.ActivatedAt.UTC())})
	}
	if st.PendingCreatedAt != nil {
		out = append(out, api.MFAFactor{Type: api.MFAFactorTypeTotp, State: api.MFAFactorStatePending, CreatedAt: st.PendingCreatedAt.UTC()})
	}
	return out
}

// EnrollTOTP answers POST /api/v1/account/security/mfa/totp.
func (h *Handlers) EnrollTOTP(ctx context.Context, _ api.EnrollTOTPRequestObject) (api.EnrollTOTPResponseObject, error) {
	e, err := h.svc.EnrollTOTP(ctx)
	if err != nil {
		return nil, err
	}
	return api.EnrollTOTP201JSONResponse{Body: api.TOTPEnrollmentResponse{
		Secret: e.Secret, OtpauthURI: e.URI, Issuer: totpIssuer, AccountName: e.AccountName,
		Algorithm: api.TOTPEnrollmentResponseAlgorithmSHA1, Digits: api.TOTPEnrollmentResponseDigitsN6, Period: api.TOTPEnrollmentResponsePeriodN30,
	}, Headers: api.EnrollTOTP201ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// VerifyTOTP answers POST /api/v1/account/security/mfa/totp/verify.
func (h *Handlers) VerifyTOTP(ctx context.Context, req api.VerifyTOTPRequestObject) (api.VerifyTOTPResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	codes, st, err := h.svc.VerifyTOTP(ctx, req.Body.TotpCode)
	if err != nil {
		return nil, err
	}
	factors := factorsOf(st)
	return api.VerifyTOTP200JSONResponse{Body: api.TOTPVerifyResponse{RecoveryCodes: codes, Factor: factors[0]},
		Headers: api.VerifyTOTP200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// CreateMFARecoveryRequest answers POST /api/v1/account/security/mfa/recovery-requests.
func (h *Handlers) CreateMFARecoveryRequest(ctx context.Context, req api.CreateMFARecoveryRequestRequestObject) (api.CreateMFARecoveryRequestResponseObject, error) {
	if req.Body == nil {
		return nil, apierr.New(apierr.InvalidRequest, "request body is required")
	}
	r, err := h.svc.RequestMFARecovery(ctx, req.Body.Reason)
	if err != nil {
		return nil, err
	}
	body := api.MFARecoveryRequest{ID: r.ID, Status: api.MFARecoveryRequestStatus(r.Status), CreatedAt: r.CreatedAt.UTC()}
	if r.Existing {
		return api.CreateMFARecoveryRequest200JSONResponse{Body: body, Headers: api.CreateMFARecoveryRequest200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
	}
	return api.CreateMFARecoveryRequest201JSONResponse{Body: body, Headers: api.CreateMFARecoveryRequest201ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

// GetMFAReadiness answers GET /api/v1/platform/iam/mfa-readiness (platform.ops.read).
func (h *Handlers) GetMFAReadiness(ctx context.Context, _ api.GetMFAReadinessRequestObject) (api.GetMFAReadinessResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	if !p.Can(principal.CapOpsRead) {
		return nil, apierr.New(apierr.AdminRequired, "this operation needs platform.ops.read")
	}
	r, err := h.svc.MFAReadiness(ctx)
	if err != nil {
		return nil, err
	}
	body := api.MFAReadinessResponse{
		GeneratedAt: h.svc.clock.Now().UTC(), PlatformRoleHolders: r.Holders,
		WithMfa: r.Holders - r.WithoutMFA, WithoutMfa: r.WithoutMFA, PendingRecoveryRequests: r.PendingRecoveryRequests,
	}
	body.ByRole = make([]struct {
		Holders    int              `json:"holders"`
		Role       api.PlatformRole `json:"role"`
		WithoutMfa int              `json:"without_mfa"`
	}, len(r.ByRole))
	for i, b := range r.ByRole {
		body.ByRole[i].Holders, body.ByRole[i].Role, body.ByRole[i].WithoutMfa = b.Holders, api.PlatformRole(b.Role), b.WithoutMFA
	}
	return api.GetMFAReadiness200JSONResponse{Body: body, Headers: api.GetMFAReadiness200ResponseHeaders{XRequestID: requestID(ctx)}}, nil
}

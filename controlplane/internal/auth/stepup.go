package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Step-up (seed §5 rule 7). POST /api/v1/auth/step-up verifies a fresh TOTP code of the
// calling user and signs an access token with amr ["pwd","otp"] and auth_time. For
// StepUpWindow after auth_time that token satisfies RequireStepUp; afterwards it is an
// ordinary access token until its exp. Sensitive operations call RequireStepUp and
// fail closed with 403 step_up_required: 403, not 401, because the caller IS
// authenticated (a 401 would make clients drop a good session); the remedy is a step-up,
// not a new sign-in.
//
// Nothing but StepUp sets amr/auth_time, and only after matchTOTP and SpendTOTPStep
// accepted a code of the user's active factor. A principal that is not a human user
// with such a factor (a service account or project access credential, when they exist)
// can never hold a step-up token: their tokens carry no amr, and they have no factor.

// mfaProof is what a verified second factor adds to an access token.
type mfaProof struct {
	amr      []string
	authTime time.Time
}

// StepUpTokens is the answer of StepUp.
type StepUpTokens struct {
	AccessToken     string
	AccessExpiresAt time.Time
	AMR             []string
	AuthTime        time.Time
	Window          time.Duration
}

func errStepUp(reason, msg string) *apierr.Error {
	return apierr.New(apierr.StepUpRequired, "%s", msg).With("reason", reason)
}

// StepUp verifies code against the caller's active TOTP factor and signs a step-up token.
func (s *Service) StepUp(ctx context.Context, code string) (StepUpTokens, error) {
	p, err := humanUser(ctx)
	if err != nil {
		return StepUpTokens{}, err
	}
	key := mfaKey(p.UserID)
	if err := s.chargeAttempt(ctx, key, errMFABackoff); err != nil {
		return StepUpTokens{}, err
	}
	now := s.clock.Now()
	var out StepUpTokens
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		f, err := q.GetTOTPFactorForUpdate(ctx, p.UserID)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && f.SecretEnc == nil) {
			return errStepUp("mfa_not_enrolled", "step-up needs an active TOTP factor: enrol one first")
		}
		if err != nil {
			return err
		}
		secret, err := s.cfg.MasterKey.openTOTPSecret(f.SecretEnc, p.UserID)
		if err != nil {
			return err
		}
		step, ok := matchTOTP(secret, code, now)
		if !ok {
			return errStepUp("totp_invalid", "the TOTP code is wrong")
		}
		n, err := q.SpendTOTPStep(ctx, authdb.SpendTOTPStepParams{Step: step, Now: now, UserID: p.UserID})
		if err != nil {
			return err
		}
		if n == 0 {
			return errStepUp("totp_replayed", "this TOTP code was already used; wait for the next one")
		}
		ident, err := loadIdentity(ctx, q, p.UserID)
		if err != nil {
			return err
		}
		proof := &mfaProof{amr: []string{"pwd", "otp"}, authTime: now.Truncate(time.Second)}
		token, exp, err := s.signAccessWith(ctx, q, ident, proof)
		if err != nil {
			return err
		}
		out = StepUpTokens{AccessToken: token, AccessExpiresAt: exp, AMR: proof.amr, AuthTime: proof.authTime, Window: s.cfg.stepUpWindow()}
		if err := clearLoginThrottle(ctx, tx, key); err != nil {
			return err
		}
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "auth.step_up", TargetType: "user", TargetID: p.UserID.String(), TenantID: p.TenantID,
			Metadata: map[string]any{"method": "totp"},
		})
	})
	if e, ok := apierr.As(err); ok {
		return StepUpTokens{}, e
	}
	if errors.Is(err, errInactive) {
		return StepUpTokens{}, apierr.New(apierr.TokenInvalid, "user cannot sign in").Wrap(err)
	}
	if err != nil {
		return StepUpTokens{}, apierr.Internal(fmt.Errorf("step-up: %w", err))
	}
	return out, nil
}

// RequireStepUp is the check of sensitive operations: nil when the caller is a user
// whose token proves a TOTP code verified within the step-up window, else 403
// step_up_required (token_missing without a principal). The window is judged when the
// token is authenticated, with the Authenticator's clock (markStepUp).
func RequireStepUp(ctx context.Context) error {
	p, ok := principal.From(ctx)
	if !ok {
		return apierr.New(apierr.TokenMissing, "authentication required")
	}
	if !p.StepUp {
		return apierr.New(apierr.StepUpRequired, "this operation needs a fresh second factor: POST /api/v1/auth/step-up with a TOTP code and retry with that token")
	}
	return nil
}

// markStepUp sets p.StepUp for this request: an otp amr whose auth_time is within the
// window (and not in the future beyond the leeway).
func (a *Authenticator) markStepUp(p *principal.Principal, now time.Time) {
	p.StepUp = p.UserID != [16]byte{} && p.Machine == nil && slices.Contains(p.AMR, "otp") && !p.AuthTime.IsZero() &&
		now.Before(p.AuthTime.Add(a.cfg.stepUpWindow())) && !now.Add(Leeway).Before(p.AuthTime)
}

// proofClaims reads amr and auth_time of verified claims: both or neither, and only
// the methods this issuer writes.
func proofClaims(c *accessClaims) ([]string, time.Time, error) {
	if len(c.AMR) == 0 && c.AuthTime == nil {
		return nil, time.Time{}, nil
	}
	if len(c.AMR) == 0 || c.AuthTime == nil {
		return nil, time.Time{}, errors.New("amr and auth_time come together")
	}
	for _, m := range c.AMR {
		if m != "pwd" && m != "otp" {
			return nil, time.Time{}, fmt.Errorf("amr %q", m)
		}
	}
	return slices.Clone(c.AMR), time.Unix(*c.AuthTime, 0), nil
}

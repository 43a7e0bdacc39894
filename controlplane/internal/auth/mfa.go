package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth/authdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// TOTP multi-factor authentication (docs/api.md, "MFA and step-up").
//
// States of a user's factor (auth_totp_factors): none → pending (EnrollTOTP: a secret was
// shown once) → active (VerifyTOTP: a code of it was typed back). A new enrolment of a
// user with an active factor keeps the active one working until its pending replacement
// is verified, and needs step-up. Once active, sign-in needs a code or a recovery code.
//
// Every accepted code spends its time-step (SpendTOTPStep): the same code, or any code of
// an earlier step, is refused afterwards, also between concurrent requests. Wrong codes
// of an authenticated user (verify, step-up) are charged to a per-user key of the
// sign-in backoff table (throttle.go), so guessing is limited like passwords are: 5 free
// failures, then a lock of 1 s doubling to GANTRY_LOGIN_BACKOFF_MAX (15 min); at sign-in
// a wrong code is simply a failed sign-in of that username.

// SecondFactor is what a sign-in presents besides the password.
type SecondFactor struct {
	TOTPCode     string
	RecoveryCode string
}

// MFAState is the posture of a user's TOTP factor.
type MFAState struct {
	State                  string // "none", "pending", "active"
	CreatedAt              time.Time
	ActivatedAt            *time.Time
	PendingCreatedAt       *time.Time
	RecoveryCodesRemaining int
	ActiveSessions         int
}

// TOTPEnrollment is the one-time answer of EnrollTOTP.
type TOTPEnrollment struct {
	Secret      string // base32, no padding
	URI         string
	AccountName string
}

// mfaKey is the backoff key of a user's TOTP checks (a SHA-256 like usernameKey, in its
// own namespace so it never collides with a username's).
func mfaKey(userID uuid.UUID) []byte {
	sum := sha256.Sum256([]byte("gantry/mfa/" + userID.String()))
	return sum[:]
}

func errMFABackoff(wait time.Duration) *apierr.Error {
	return apierr.New(apierr.RateLimitExceeded, "too many wrong codes; retry later").
		With("reason", "mfa_backoff").WithRetryAfter(wait)
}

// EnrollTOTP starts an enrolment for the caller: a new secret, sealed and stored as
// pending, returned this once. Replacing an active factor needs step-up.
func (s *Service) EnrollTOTP(ctx context.Context) (TOTPEnrollment, error) {
	p, err := humanUser(ctx)
	if err != nil {
		return TOTPEnrollment{}, err
	}
	q := authdb.New(db.Querier(ctx, s.pool))
	f, err := q.GetTOTPFactor(ctx, p.UserID)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return TOTPEnrollment{}, apierr.Internal(fmt.Errorf("totp factor: %w", err))
	}
	if err == nil && f.SecretEnc != nil {
		if err := RequireStepUp(ctx); err != nil {
			return TOTPEnrollment{}, err
		}
	}
	secret, err := newTOTPSecret()
	if err != nil {
		return TOTPEnrollment{}, apierr.Internal(err)
	}
	uri, err := otpauthURI(p.Username, secret)
	if err != nil {
		return TOTPEnrollment{}, apierr.Internal(err)
	}
	sealed, err := s.cfg.MasterKey.sealTOTPSecret(secret, p.UserID)
	if err != nil {
		return TOTPEnrollment{}, apierr.Internal(err)
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := authdb.New(tx).UpsertPendingTOTP(ctx, authdb.UpsertPendingTOTPParams{
			UserID: p.UserID, PendingSecretEnc: sealed, Now: s.clock.Now(),
		}); err != nil {
			return err
		}
		return s.audit.Record(ctx, tx, audit.Entry{
			Action: "mfa.totp.enroll", TargetType: "user", TargetID: p.UserID.String(), TenantID: p.TenantID,
		})
	})
	if err != nil {
		return TOTPEnrollment{}, apierr.Internal(fmt.Errorf("totp enrol: %w", err))
	}
	return TOTPEnrollment{Secret: b32.EncodeToString(secret), URI: uri, AccountName: p.Username}, nil
}

// VerifyTOTP finishes the caller's enrolment with a code of the pending secret: the
// factor becomes active and fresh recovery codes (returned this once) replace any
// earlier ones. A wrong code changes nothing but the backoff.
func (s *Service) VerifyTOTP(ctx context.Context, code string) ([]string, MFAState, error) {
	p, err := humanUser(ctx)
	if err != nil {
		return nil, MFAState{}, err
	}
	key := mfaKey(p.UserID)
	f, err := authdb.New(db.Querier(ctx, s.pool)).GetTOTPFactor(ctx, p.UserID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && f.PendingSecretEnc == nil) {
		return nil, MFAState{}, apierr.New(apierr.InvalidRequest, "no TOTP enrolment is pending: POST /api/v1/account/security/mfa/totp first")
	}
	if err != nil {
		return nil, MFAState{}, apierr.Internal(fmt.Errorf("totp factor: %w", err))
	}
	if err := s.chargeAttempt(ctx, key, errMFABackoff); err != nil {
		return nil, MFAState{}, err
	}
	secret, err := s.cfg.MasterKey.openTOTPSecret(f.PendingSecretEnc, p.UserID)
	if err != nil {
		return nil, MFAState{}, apierr.Internal(err)
	}
	step, ok := matchTOTP(secret, code, s.clock.Now())
	if !ok {
		return nil, MFAState{}, apierr.New(apierr.ValidationError, "the code does not match the pending TOTP secret").
			With("field", "totp_code").With("reason", "totp_invalid")
	}
	codes, hashes, err := s.newRecoveryCodes(p.UserID)
	if err != nil {
		return nil, MFAState{}, apierr.Internal(err)
	}
	now := s.clock.Now()
	var state MFAState
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := authdb.New(tx)
		n, err := q.ActivatePendingTOTP(ctx, authdb.ActivatePendingTOTPParams{Now: now, Step: step, UserID: p.UserID})
		if err != nil {
			return err
		}
		if n == 0 {
			return errNoPending // verified concurrently
		}
		if err := q.DeleteRecoveryCodes(ctx, p.UserID); err != nil {
			return err
		}
		for _, h := range hashes {
			if err := q.InsertRecoveryCode(ctx, authdb.InsertRecoveryCodeParams{ID: s.ids.New(), UserID: p.UserID, CodeHash: h, CreatedAt: now}); err != nil {
				return err
			}
		}
		if err := clearLoginThrottle(ctx, tx, key); err != nil {
			return err
		}
		if err := s.audit.Record(ctx, tx, audit.Entry{
			Action: "mfa.totp.activate", TargetType: "user", TargetID: p.UserID.String(), TenantID: p.TenantID,
			Metadata: map[string]any{"recovery_codes": len(codes)},
		}); err != nil {
			return err
		}
		state, err = mfaState(ctx, q, p.UserID, now)
		return err
	})
	if errors.Is(err, errNoPending) {
		return nil, MFAState{}, apierr.New(apierr.InvalidRequest, "no TOTP enrolment is pending")
	}
	if err != nil {
		return nil, MFAState{}, apierr.Internal(fmt.Errorf("totp verify: %w", err))
	}
	return codes, state, nil
}

var errNoPending = errors.New("auth: no pending totp enrolment")

// Posture is the caller's MFA state, recovery codes left and active sessions.
func (s *Service) Posture(ctx context.Context, userID uuid.UUID) (MFAState, error) {
	st, err := mfaState(ctx, authdb.New(db.Querier(ctx, s.pool)), userID, s.clock.Now())
	if err != nil {
		return MFAState{}, apierr.Internal(fmt.Errorf("mfa posture: %w", err))
	}
	return st, nil
}

func mfaState(ctx context.Context, q *authdb.Queries, userID uuid.UUID, now time.Time) (MFAState, error) {
	var st MFAState
	f, err := q.GetTOTPFactor(ctx, userID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		st.State = "none"
	case err != nil:
		return MFAState{}, err
	default:
		st.CreatedAt, st.ActivatedAt, st.PendingCreatedAt = f.CreatedAt, f.ActivatedAt, f.PendingCreatedAt
		switch {
		case f.SecretEnc != nil:
			st.State = "active"
		case f.PendingSecretEnc != nil:
			st.State = "pending"
		default:
			st.State = "none"
		}
	}
	n, err := q.CountUnusedRecoveryCodes(ctx, userID)
	if err != nil {
		return MFAState{}, err
	}
	sessions, err := q.CountActiveSessions(ctx, authdb.CountActiveSessionsParams{UserID: userID, Now: now})
	if err != nil {
		return MFAState{}, err
	}
	if st.State != "active" {
		n = 0 // codes of a factor that no longer exists cannot be used
	}
	st.RecoveryCodesRemaining, st.ActiveSessions = int(n), int(sessions)
	return st, nil
}

// checkSecondFactor is the MFA part of a sign-in whose password was right, inside its
// transaction: nil when the user has no active factor or presented a good code (whose
// step, or recovery code, is spent in tx); else the sign-in fails with token_invalid.
func (s *Service) checkSecondFactor(ctx context.Context, tx pgx.Tx, userID uuid.UUID, sf SecondFactor) (method string, err error) {
	q := authdb.New(tx)
	f, err := q.GetTOTPFactorForUpdate(ctx, userID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && f.SecretEnc == nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("totp factor: %w", err)
	}
	switch {
	case sf.TOTPCode != "" && sf.RecoveryCode != "":
		return "", errSecondFactor("mfa_ambiguous", "send either totp_code or recovery_code, not both")
	case sf.RecoveryCode != "":
		n, err := q.UseRecoveryCode(ctx, authdb.UseRecoveryCodeParams{Now: s.clock.Now(), UserID: userID, CodeHash: s.recoveryCodeHash(userID, sf.RecoveryCode)})
		if err != nil {
			return "", fmt.Errorf("recovery code: %w", err)
		}
		if n == 0 {
			return "", errSecondFactor("recovery_code_invalid", "the recovery code is wrong or was already used")
		}
		return "recovery_code", nil
	case sf.TOTPCode == "":
		return "", errSecondFactor("mfa_required", "this account has TOTP enabled: send totp_code (or a recovery_code)")
	}
	secret, err := s.cfg.MasterKey.openTOTPSecret(f.SecretEnc, userID)
	if err != nil {
		return "", err
	}
	step, ok := matchTOTP(secret, sf.TOTPCode, s.clock.Now())
	if !ok {
		return "", errSecondFactor("totp_invalid", "the TOTP code is wrong")
	}
	n, err := q.SpendTOTPStep(ctx, authdb.SpendTOTPStepParams{Step: step, Now: s.clock.Now(), UserID: userID})
	if err != nil {
		return "", fmt.Errorf("spend totp step: %w", err)
	}
	if n == 0 {
		return "", errSecondFactor("totp_replayed", "this TOTP code was already used; wait for the next one")
	}
	return "totp", nil
}

// secondFactorError is a sign-in refused for its second factor (the password was right).
type secondFactorError struct{ e *apierr.Error }

func (e secondFactorError) Error() string { return e.e.Error() }

func errSecondFactor(reason, msg string) error {
	return secondFactorError{apierr.New(apierr.TokenInvalid, "%s", msg).With("reason", reason)}
}

// humanUser is the calling user; MFA belongs to people, so a principal that is not a
// user (none exists yet besides users; service accounts will not have user rows) fails.
func humanUser(ctx context.Context) (*principal.Principal, error) {
	p, ok := principal.From(ctx)
	if !ok || p.UserID == uuid.Nil {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	if p.Machine != nil { // seed §5 rule 7: a machine identity never holds a second factor
		return nil, apierr.Forbidden("a service account or access credential cannot use MFA or step-up").With("reason", "machine_identity")
	}
	return p, nil
}

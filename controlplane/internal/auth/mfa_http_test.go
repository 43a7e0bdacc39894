package auth_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// These tests drive the MFA and step-up operations through the real server (every
// response validated against the contract) on a manual clock; TOTP codes come from
// oathtool, the authenticator implementation Debian ships, so server and apps agree.

// answer is the whole answer of one request (apitest.Answer).
type answer = apitest.Answer

func call(t *testing.T, e *apitest.Env, method, path, token string, body any) answer {
	t.Helper()
	return e.Call(t, method, path, token, body, "")
}

func count(t *testing.T, e *apitest.Env, query string, args ...any) int {
	t.Helper()
	return e.Count(t, query, args...)
}

// oathtool is the code an authenticator app shows for secret at now.
var oathtool = apitest.Oathtool

func want(t *testing.T, what string, a answer, status int, code, reason string) {
	t.Helper()
	if a.Status != status || a.Code() != code || (reason != "" && a.Reason() != reason) {
		t.Fatalf("%s: %d %s (%s) %v, want %d %s (%s)", what, a.Status, a.Code(), a.Reason(), a.Body["message"], status, code, reason)
	}
}

func jwtClaims(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWS: %q", token)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func newMFAEnv(t *testing.T) (*apitest.Env, *clock.Manual) {
	// On a step boundary, so "the next code" is exactly 30 s away.
	clk := clock.NewManual(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	return apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.Clock = clk })), clk
}

func login(t *testing.T, e *apitest.Env, username string, extra map[string]string) answer {
	t.Helper()
	body := map[string]string{"username": username, "password": apitest.Password}
	for k, v := range extra {
		body[k] = v
	}
	return call(t, e, "POST", "/api/v1/auth/login", "", body)
}

// TestTOTPEnrolLoginReplayRecovery: enrolment → sign-in needs a code → a used code is
// refused → a recovery code works once → the posture says so.
func TestTOTPEnrolLoginReplayRecovery(t *testing.T) {
	e, clk := newMFAEnv(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "MFA")
	user, tok := ten.AdminUsername, ten.AdminToken

	a := call(t, e, "GET", "/api/v1/account/security", tok, nil)
	want(t, "posture before", a, 200, "", "")
	if mfa := a.Body["mfa"].(map[string]any); mfa["state"] != "none" || mfa["enabled"] != false || mfa["recovery_codes_remaining"] != 0.0 {
		t.Fatalf("posture before: %v", a.Body)
	}
	if s := a.Body["sessions"].(map[string]any); s["active"] != 1.0 {
		t.Fatalf("sessions: %v", a.Body["sessions"])
	}

	// Verify without an enrolment: 400, nothing stored.
	want(t, "verify before enrol", call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", tok, map[string]string{"totp_code": "123456"}), 400, "invalid_request", "")

	en := call(t, e, "POST", "/api/v1/account/security/mfa/totp", tok, nil)
	want(t, "enrol", en, 201, "", "")
	secret := en.Body["secret"].(string)
	uri := en.Body["otpauth_uri"].(string)
	if !strings.HasPrefix(uri, "otpauth://totp/Gantry:"+user+"?") || !strings.Contains(uri, "secret="+secret) {
		t.Fatalf("otpauth uri %q", uri)
	}
	// Sealed at rest: the stored bytes contain neither the secret nor its base32.
	var sealed []byte
	if err := e.Pool.QueryRow(context.Background(), `SELECT pending_secret_enc FROM auth_totp_factors`).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(secret)) || len(sealed) < 20+28 {
		t.Fatalf("secret stored in clear or not sealed (%d bytes)", len(sealed))
	}

	// A wrong code changes nothing: still pending, no recovery codes.
	good := oathtool(t, secret, clk.Now())
	wrong := fmt.Sprintf("%06d", (atoi(good)+1)%1000000)
	want(t, "verify wrong", call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", tok, map[string]string{"totp_code": wrong}), 422, "validation_error", "totp_invalid")
	if n := count(t, e, `SELECT count(*) FROM auth_totp_factors WHERE secret_enc IS NOT NULL`); n != 0 {
		t.Fatal("a wrong code activated the factor")
	}
	if n := count(t, e, `SELECT count(*) FROM auth_recovery_codes`); n != 0 {
		t.Fatal("a wrong code stored recovery codes")
	}
	// Until verified, sign-in needs no code.
	want(t, "login while pending", login(t, e, user, nil), 200, "", "")

	v := call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", tok, map[string]string{"totp_code": good})
	want(t, "verify", v, 200, "", "")
	var codes []string
	for _, c := range v.Body["recovery_codes"].([]any) {
		codes = append(codes, c.(string))
	}
	if len(codes) != 10 {
		t.Fatalf("%d recovery codes", len(codes))
	}
	for _, c := range codes {
		if n := count(t, e, `SELECT count(*) FROM auth_recovery_codes WHERE position($1::bytea in code_hash) > 0`, []byte(c)); n != 0 {
			t.Fatal("recovery code stored in clear")
		}
	}

	// Sign-in now needs a code.
	want(t, "login without code", login(t, e, user, nil), 401, "token_invalid", "mfa_required")
	want(t, "login wrong code", login(t, e, user, map[string]string{"totp_code": wrong}), 401, "token_invalid", "totp_invalid")
	// The code that verified the enrolment is spent: same step, refused.
	want(t, "login replaying the verify code", login(t, e, user, map[string]string{"totp_code": good}), 401, "token_invalid", "totp_replayed")

	// An expired code (two steps old) is wrong, not merely replayed.
	clk.Advance(90 * time.Second)
	want(t, "login with an expired code", login(t, e, user, map[string]string{"totp_code": oathtool(t, secret, clk.Now().Add(-60*time.Second))}), 401, "token_invalid", "totp_invalid")
	next := oathtool(t, secret, clk.Now())
	want(t, "login with the next code", login(t, e, user, map[string]string{"totp_code": next}), 200, "", "")
	want(t, "login replaying it", login(t, e, user, map[string]string{"totp_code": next}), 401, "token_invalid", "totp_replayed")

	// Concurrent sign-ins with one fresh code: exactly one gets in.
	clk.Advance(30 * time.Second)
	racing := oathtool(t, secret, clk.Now())
	var wg sync.WaitGroup
	results := make(chan int, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(map[string]string{"username": user, "password": apitest.Password, "totp_code": racing})
			resp, err := e.HTTPClient().Do(e.Request("POST", "/api/v1/auth/login", "", string(b)))
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(results)
	ok200 := 0
	for st := range results {
		if st == 200 {
			ok200++
		} else if st != 401 {
			t.Fatalf("concurrent sign-in answered %d", st)
		}
	}
	if ok200 != 1 {
		t.Fatalf("%d of 4 concurrent sign-ins with one code succeeded, want 1", ok200)
	}

	// A recovery code works once, in upper case and without its hyphen too.
	rc := strings.ToUpper(strings.ReplaceAll(codes[3], "-", ""))
	want(t, "login with a recovery code", login(t, e, user, map[string]string{"recovery_code": rc}), 200, "", "")
	want(t, "recovery code again", login(t, e, user, map[string]string{"recovery_code": codes[3]}), 401, "token_invalid", "recovery_code_invalid")
	want(t, "both factors", login(t, e, user, map[string]string{"recovery_code": codes[4], "totp_code": next}), 401, "token_invalid", "mfa_ambiguous")

	a = call(t, e, "GET", "/api/v1/account/security", tok, nil)
	mfa := a.Body["mfa"].(map[string]any)
	if mfa["state"] != "active" || mfa["enabled"] != true || mfa["recovery_codes_remaining"] != 9.0 || len(mfa["factors"].([]any)) != 1 {
		t.Fatalf("posture after: %v", a.Body)
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action IN ('mfa.totp.enroll', 'mfa.totp.activate')`); n != 2 {
		t.Fatalf("%d enrol/activate audit rows, want 2", n)
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'user.login' AND metadata->>'second_factor' = 'recovery_code'`); n != 1 {
		t.Fatalf("%d logins audited with a recovery code, want 1", n)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// enrolled is a tenant admin with an active TOTP factor (verified at the clock's now).
func enrolled(t *testing.T, e *apitest.Env, clk *clock.Manual) (username, token, secret string) {
	t.Helper()
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "StepUp")
	en := call(t, e, "POST", "/api/v1/account/security/mfa/totp", ten.AdminToken, nil)
	want(t, "enrol", en, 201, "", "")
	secret = en.Body["secret"].(string)
	want(t, "verify", call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", ten.AdminToken,
		map[string]string{"totp_code": oathtool(t, secret, clk.Now())}), 200, "", "")
	return ten.AdminUsername, ten.AdminToken, secret
}

// TestStepUp: a wrong or replayed code is refused; a good one gives a token with amr and
// auth_time that satisfies step-up for the window only (injected clock); replacing an
// active factor needs it.
func TestStepUp(t *testing.T) {
	e, clk := newMFAEnv(t)
	_, tok, secret := enrolled(t, e, clk)
	clk.Advance(30 * time.Second)
	good := oathtool(t, secret, clk.Now())
	wrong := fmt.Sprintf("%06d", (atoi(good)+500000)%1000000)

	want(t, "step-up without a body", call(t, e, "POST", "/api/v1/auth/step-up", tok, nil), 422, "validation_error", "")
	want(t, "step-up with a malformed code", call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": "12345"}), 422, "validation_error", "")
	want(t, "step-up without a bearer", call(t, e, "POST", "/api/v1/auth/step-up", "", map[string]string{"totp_code": good}), 401, "token_missing", "")
	want(t, "step-up wrong code", call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": wrong}), 403, "step_up_required", "totp_invalid")
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'auth.step_up'`); n != 0 {
		t.Fatal("a refused step-up was audited as a step-up")
	}
	// Replacing the active factor needs step-up.
	want(t, "re-enrol without step-up", call(t, e, "POST", "/api/v1/account/security/mfa/totp", tok, nil), 403, "step_up_required", "")
	if n := count(t, e, `SELECT count(*) FROM auth_totp_factors WHERE pending_secret_enc IS NOT NULL`); n != 0 {
		t.Fatal("a refused re-enrolment stored a pending secret")
	}
	a := call(t, e, "GET", "/api/v1/account/security", tok, nil)
	if a.Body["step_up"].(map[string]any)["satisfied"] != false {
		t.Fatalf("a sign-in token satisfies step-up: %v", a.Body)
	}

	su := call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": good})
	want(t, "step-up", su, 200, "", "")
	if su.Body["step_up_expires_in"] != 300.0 || su.Body["expires_in"] != 900.0 {
		t.Fatalf("step-up answer: %v", su.Body)
	}
	stepTok := su.Body["access_token"].(string)
	c := jwtClaims(t, stepTok)
	if fmt.Sprint(c["amr"]) != "[pwd otp]" || c["auth_time"] != float64(clk.Now().Unix()) {
		t.Fatalf("step-up claims: amr %v auth_time %v (now %d)", c["amr"], c["auth_time"], clk.Now().Unix())
	}
	if _, ok := jwtClaims(t, tok)["amr"]; ok {
		t.Fatal("a password sign-in token carries amr")
	}
	want(t, "step-up replaying the code", call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": good}), 403, "step_up_required", "totp_replayed")

	a = call(t, e, "GET", "/api/v1/account/security", stepTok, nil)
	if a.Body["step_up"].(map[string]any)["satisfied"] != true {
		t.Fatalf("step-up token does not satisfy step-up: %v", a.Body)
	}
	want(t, "re-enrol with step-up", call(t, e, "POST", "/api/v1/account/security/mfa/totp", stepTok, nil), 201, "", "")

	// Past the window the token still authenticates but no longer satisfies step-up.
	clk.Advance(5*time.Minute + time.Second)
	a = call(t, e, "GET", "/api/v1/account/security", stepTok, nil)
	want(t, "posture with an old step-up token", a, 200, "", "")
	if a.Body["step_up"].(map[string]any)["satisfied"] != false {
		t.Fatalf("step-up token past its window still satisfies step-up: %v", a.Body)
	}
	want(t, "re-enrol with an old step-up token", call(t, e, "POST", "/api/v1/account/security/mfa/totp", stepTok, nil), 403, "step_up_required", "")
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'auth.step_up'`); n != 1 {
		t.Fatalf("%d step-up audit rows, want 1", n)
	}
}

// TestStepUpWithoutFactorAndBackoff: no factor → refused; wrong codes are limited per
// user with the sign-in backoff (5 free, then 429 mfa_backoff with Retry-After).
func TestStepUpWithoutFactorAndBackoff(t *testing.T) {
	e, clk := newMFAEnv(t)
	_, adminTok := e.PlatformAdmin(t)
	plain := e.NewTenant(t, adminTok, "NoMFA")
	want(t, "step-up without a factor", call(t, e, "POST", "/api/v1/auth/step-up", plain.AdminToken, map[string]string{"totp_code": "123456"}), 403, "step_up_required", "mfa_not_enrolled")

	_, tok, secret := enrolled(t, e, clk)
	clk.Advance(30 * time.Second)
	good := oathtool(t, secret, clk.Now())
	wrong := fmt.Sprintf("%06d", (atoi(good)+1)%1000000)
	for i := 1; i < 5; i++ { // the earlier step-up without a factor was another user's
		want(t, fmt.Sprintf("wrong code %d", i), call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": wrong}), 403, "step_up_required", "totp_invalid")
	}
	want(t, "wrong code 5", call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": wrong}), 403, "step_up_required", "totp_invalid")
	resp := e.Do(e.Request("POST", "/api/v1/auth/step-up", tok, `{"totp_code":"`+good+`"}`))
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("locked step-up: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	clk.Advance(time.Second)
	want(t, "good code after the lock", call(t, e, "POST", "/api/v1/auth/step-up", tok, map[string]string{"totp_code": good}), 200, "", "")
}

// TestMFARecoveryRequestAndReadiness: a recovery request is recorded once, audited and
// counted; the readiness read model is for operators and counts holders without MFA.
func TestMFARecoveryRequestAndReadiness(t *testing.T) {
	e, clk := newMFAEnv(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Recovery")

	want(t, "blank reason", call(t, e, "POST", "/api/v1/account/security/mfa/recovery-requests", ten.AdminToken, map[string]string{"reason": "  "}), 422, "validation_error", "")
	if n := count(t, e, `SELECT count(*) FROM auth_mfa_recovery_requests`); n != 0 {
		t.Fatal("a blank request was stored")
	}
	r1 := call(t, e, "POST", "/api/v1/account/security/mfa/recovery-requests", ten.AdminToken, map[string]string{"reason": "lost my phone"})
	want(t, "request", r1, 201, "", "")
	if r1.Body["status"] != "pending" {
		t.Fatalf("request: %v", r1.Body)
	}
	clk.Advance(time.Minute)
	r2 := call(t, e, "POST", "/api/v1/account/security/mfa/recovery-requests", ten.AdminToken, map[string]string{"reason": "again"})
	want(t, "request again", r2, 200, "", "")
	if r2.Body["id"] != r1.Body["id"] {
		t.Fatalf("second request %v, want the open %v", r2.Body["id"], r1.Body["id"])
	}
	if n := count(t, e, `SELECT count(*) FROM audit_events WHERE action = 'mfa.recovery_request.create' AND target_id = $1`, r1.Body["id"]); n != 1 {
		t.Fatalf("%d audit rows for the request, want 1", n)
	}

	want(t, "readiness as a tenant admin", call(t, e, "GET", "/api/v1/platform/iam/mfa-readiness", ten.AdminToken, nil), 403, "admin_required", "")
	// Holders: the platform admin (users.role) and an operator bound to platform_ops,
	// who then enrols TOTP.
	opsID := e.App.IDs.New()
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO users (id, username, display_name, role, created_at, updated_at) VALUES ($1, 'ops-1', 'Ops', 'user', now(), now())`, opsID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO platform_role_bindings (user_id, role, created_at) VALUES ($1, 'platform_ops', now())`, opsID); err != nil {
		t.Fatal(err)
	}
	opsTok := e.Token(t, opsID)
	r := call(t, e, "GET", "/api/v1/platform/iam/mfa-readiness", opsTok, nil)
	want(t, "readiness as an operator", r, 200, "", "")
	if r.Body["platform_role_holders"] != 2.0 || r.Body["without_mfa"] != 2.0 || r.Body["with_mfa"] != 0.0 || r.Body["pending_recovery_requests"] != 1.0 {
		t.Fatalf("readiness: %v", r.Body)
	}
	en := call(t, e, "POST", "/api/v1/account/security/mfa/totp", opsTok, nil)
	want(t, "ops enrols", en, 201, "", "")
	want(t, "ops verifies", call(t, e, "POST", "/api/v1/account/security/mfa/totp/verify", opsTok,
		map[string]string{"totp_code": oathtool(t, en.Body["secret"].(string), clk.Now())}), 200, "", "")
	r = call(t, e, "GET", "/api/v1/platform/iam/mfa-readiness", adminTok, nil)
	want(t, "readiness as the admin", r, 200, "", "")
	if r.Body["platform_role_holders"] != 2.0 || r.Body["without_mfa"] != 1.0 || r.Body["with_mfa"] != 1.0 {
		t.Fatalf("readiness after enrolment: %v", r.Body)
	}
	byRole := fmt.Sprint(r.Body["by_role"])
	if byRole != "[map[holders:1 role:platform_ops without_mfa:0] map[holders:1 role:platform_superadmin without_mfa:1]]" {
		t.Fatalf("by_role: %s", byRole)
	}
}

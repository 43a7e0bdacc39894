package auth

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pquerna/otp"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// TestTOTPRFC6238Vectors: the codes are RFC 6238's (Appendix B) for every hash.
func TestTOTPRFC6238Vectors(t *testing.T) {
	seeds := map[otp.Algorithm][]byte{
		otp.AlgorithmSHA1:   []byte("12345678901234567890"),
		otp.AlgorithmSHA256: []byte("12345678901234567890123456789012"),
		otp.AlgorithmSHA512: []byte("1234567890123456789012345678901234567890123456789012345678901234"),
	}
	vectors := []struct {
		unix int64
		alg  otp.Algorithm
		code string
	}{
		{59, otp.AlgorithmSHA1, "94287082"}, {59, otp.AlgorithmSHA256, "46119246"}, {59, otp.AlgorithmSHA512, "90693936"},
		{1111111109, otp.AlgorithmSHA1, "07081804"}, {1111111109, otp.AlgorithmSHA256, "68084774"}, {1111111109, otp.AlgorithmSHA512, "25091201"},
		{1111111111, otp.AlgorithmSHA1, "14050471"}, {1111111111, otp.AlgorithmSHA256, "67062674"}, {1111111111, otp.AlgorithmSHA512, "99943326"},
		{1234567890, otp.AlgorithmSHA1, "89005924"}, {1234567890, otp.AlgorithmSHA256, "91819424"}, {1234567890, otp.AlgorithmSHA512, "93441116"},
		{2000000000, otp.AlgorithmSHA1, "69279037"}, {2000000000, otp.AlgorithmSHA256, "90698825"}, {2000000000, otp.AlgorithmSHA512, "38618901"},
		{20000000000, otp.AlgorithmSHA1, "65353130"}, {20000000000, otp.AlgorithmSHA256, "77737706"}, {20000000000, otp.AlgorithmSHA512, "47863826"},
	}
	for _, v := range vectors {
		got, err := totpCodeAt(seeds[v.alg], totpStep(time.Unix(v.unix, 0)), otp.DigitsEight, v.alg)
		if err != nil || got != v.code {
			t.Errorf("T=%d %s: %q (%v), want %s", v.unix, v.alg, got, err, v.code)
		}
	}
	// The server's own check (6 digits, SHA-1) accepts the vector's last 6 digits at
	// its time and the neighbouring steps, and tells which step matched.
	secret := seeds[otp.AlgorithmSHA1]
	at := time.Unix(1234567890, 0)
	for _, off := range []int64{-1, 0, 1} {
		step, ok := matchTOTP(secret, "005924", at.Add(time.Duration(off)*totpPeriod*time.Second))
		if !ok || step != totpStep(at) {
			t.Errorf("offset %d steps: step %d ok %v, want %d", off, step, ok, totpStep(at))
		}
	}
	if _, ok := matchTOTP(secret, "005924", at.Add(2*totpPeriod*time.Second)); ok {
		t.Error("a code two steps old is accepted")
	}
	for _, bad := range []string{"", "00592", "0059245", "005925"} {
		if _, ok := matchTOTP(secret, bad, at); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestTOTPSecretSealing: sealed secrets open only for their user and master key.
func TestTOTPSecretSealing(t *testing.T) {
	k := testMasterKey(7)
	u1, u2 := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	sealed, err := k.sealTOTPSecret([]byte("0123456789abcdefghij"), u1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k.openTOTPSecret(sealed, u1); err != nil || string(got) != "0123456789abcdefghij" {
		t.Fatalf("open: %q %v", got, err)
	}
	if _, err := k.openTOTPSecret(sealed, u2); err == nil {
		t.Fatal("a secret opens for another user")
	}
	if _, err := testMasterKey(8).openTOTPSecret(sealed, u1); err == nil {
		t.Fatal("a secret opens under another master key")
	}
}

// TestRequireStepUpWindow: a step-up token satisfies RequireStepUp until auth_time +
// StepUpWindow on the authenticator's clock, then no longer (it still authenticates); a
// token without the proof never does.
func TestRequireStepUpWindow(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	uid := f.createUser(t, "carol", userOpts{tenant: true})
	ident, err := loadIdentityForTest(ctx, f, uid)
	if err != nil {
		t.Fatal(err)
	}
	plain, _, err := f.svc.signAccess(ctx, ident)
	if err != nil {
		t.Fatal(err)
	}
	stepped, _, err := f.svc.signAccessWith(ctx, nil, ident, &mfaProof{amr: []string{"pwd", "otp"}, authTime: f.clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	check := func(token string) error {
		p, err := f.authn.Verify(ctx, token)
		if err != nil {
			t.Fatalf("verify: %v", err)
		}
		return RequireStepUp(principal.With(ctx, p))
	}
	wantCode(t, check(plain), apierr.StepUpRequired)
	wantCode(t, check(stepped), "")
	f.clock.Advance(f.cfg.StepUpWindow - time.Second)
	wantCode(t, check(stepped), "") // from the verification cache: still judged now
	f.clock.Advance(time.Second)
	wantCode(t, check(stepped), apierr.StepUpRequired)
	wantCode(t, RequireStepUp(ctx), apierr.TokenMissing)
	if e, _ := apierr.As(RequireStepUp(principal.With(ctx, &principal.Principal{UserID: uid}))); e.HTTPStatus() != 403 {
		t.Fatalf("step_up_required is %d, want 403", e.HTTPStatus())
	}
	// A principal with the amr but no user (what a machine credential would be) never
	// satisfies step-up.
	p := &principal.Principal{AMR: []string{"pwd", "otp"}, AuthTime: f.clock.Now()}
	f.authn.markStepUp(p, f.clock.Now())
	if p.StepUp {
		t.Fatal("a principal without a user satisfies step-up")
	}
}

func loadIdentityForTest(ctx context.Context, f *fixture, uid uuid.UUID) (Identity, error) {
	tok, err := f.svc.IssueFor(ctx, uid)
	return tok.Identity, err
}

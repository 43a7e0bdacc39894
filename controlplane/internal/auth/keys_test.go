package auth

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestRotation(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	user := f.createUser(t, "alice", userOpts{tenant: true})
	k1 := f.keys.ActiveKID()

	if rotated, err := f.keys.RotateIfDue(ctx); err != nil || rotated {
		t.Fatalf("RotateIfDue on a fresh key = %v, %v; want false", rotated, err)
	}
	if n := f.auditCount(t, "auth.signing_key.create"); n != 1 {
		t.Fatalf("%d auth.signing_key.create audit rows, want 1", n)
	}

	// A token signed by K1 a minute before rotation is due.
	f.clock.Advance(f.cfg.SigningKeyRotation - time.Minute)
	old, err := f.svc.IssueFor(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Minute)
	rotatedAt := f.clock.Now()
	if rotated, err := f.keys.RotateIfDue(ctx); err != nil || !rotated {
		t.Fatalf("RotateIfDue when due = %v, %v; want true", rotated, err)
	}
	k2 := f.keys.ActiveKID()
	if k2 == k1 || k2 == "" {
		t.Fatalf("active kid %q after rotation from %q", k2, k1)
	}
	if n := f.auditCount(t, "auth.signing_key.rotate"); n != 1 {
		t.Fatalf("%d auth.signing_key.rotate audit rows, want 1", n)
	}
	if rotated, err := f.keys.RotateIfDue(ctx); err != nil || rotated {
		t.Fatalf("rotated twice (%v)", err)
	}

	// Both keys are published; new tokens are signed by K2; old ones still verify.
	jwks, err := f.keys.PublicKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(jwks) != 2 || jwks[0]["kid"] != k2 || jwks[1]["kid"] != k1 {
		t.Fatalf("jwks = %v, want [%s %s]", kids(jwks), k2, k1)
	}
	for _, k := range jwks {
		if _, ok := k["d"]; ok || k["alg"] != "RS256" || k["use"] != "sig" || k["kty"] != "RSA" {
			t.Errorf("published jwk %v", k)
		}
	}
	fresh, err := f.svc.IssueFor(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.authenticate(fresh.AccessToken), "")
	wantCode(t, f.authenticate(old.AccessToken), "")

	// Past the old token's exp (+ leeway) but while K1 is still published: expired.
	f.clock.Set(old.AccessExpiresAt.Add(Leeway + time.Second))
	wantCode(t, f.authenticate(old.AccessToken), apierr.TokenExpired)

	// Once K1 has left the set, its tokens are not ours any more: token_invalid.
	f.clock.Set(rotatedAt.Add(f.keys.RetiredKeyGrace()))
	wantCode(t, f.authenticate(old.AccessToken), apierr.TokenInvalid)
	if err := f.keys.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	jwks, err = f.keys.PublicKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(jwks) != 1 || jwks[0]["kid"] != k2 {
		t.Fatalf("jwks after K1 expired = %v, want [%s]", kids(jwks), k2)
	}
	if f.keys.RetiredKeyGrace() < f.cfg.AccessTokenTTL+Leeway {
		t.Fatalf("retired keys published for %s, less than TTL + leeway", f.keys.RetiredKeyGrace())
	}
}

func kids(set []map[string]any) []any {
	var out []any
	for _, k := range set {
		out = append(out, k["kid"])
	}
	return out
}

// A key created by another replica is found through the reload an unknown kid
// triggers, at most once per 10 s.
func TestUnknownKidReloadsAcrossReplicas(t *testing.T) {
	a := newFixture(t)
	ctx := context.Background()
	// Each replica has its own clock.
	b := newReplica(t, a.pool, clock.NewManual(t0))
	user := a.createUser(t, "alice", userOpts{})
	due := t0.Add(a.cfg.SigningKeyRotation)

	// A forged kid spends B's reload allowance 5 s before A rotates.
	b.clock.Set(due.Add(-5 * time.Second))
	wantCode(t, b.authn.authenticateKid(t, uuid.NewString()), apierr.TokenInvalid)

	a.clock.Set(due)
	if rotated, err := a.keys.RotateIfDue(ctx); err != nil || !rotated {
		t.Fatalf("rotate: %v %v", rotated, err)
	}
	tok, err := a.svc.IssueFor(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	// Inside the same 10 s B does not reload again...
	b.clock.Set(due)
	wantCode(t, b.authenticate(tok.AccessToken), apierr.TokenInvalid)
	// ...after it, the unknown kid reloads and the token verifies.
	b.clock.Set(due.Add(5 * time.Second))
	wantCode(t, b.authenticate(tok.AccessToken), "")

	// Concurrent replicas rotating at once create exactly one new key.
	a.clock.Advance(a.cfg.SigningKeyRotation)
	b.clock.Set(a.clock.Now())
	results := make(chan bool, 2)
	for _, f := range []*fixture{a, b} {
		go func() {
			rotated, err := f.keys.RotateIfDue(ctx)
			if err != nil {
				t.Error(err)
			}
			results <- rotated
		}()
	}
	if r1, r2 := <-results, <-results; r1 == r2 {
		t.Fatalf("concurrent rotations = %v, %v; want exactly one", r1, r2)
	}
	var active int
	if err := a.pool.QueryRow(ctx, `SELECT count(*) FROM auth_signing_keys WHERE state = 'active'`).Scan(&active); err != nil || active != 1 {
		t.Fatalf("%d active keys (%v), want 1", active, err)
	}
}

func (a *Authenticator) authenticateKid(t *testing.T, kid string) error {
	t.Helper()
	_, err := a.Verify(context.Background(), hs256(map[string]any{"alg": "RS256", "kid": kid}, accessClaims{}, nil))
	return err
}

func TestSigningKeyEncryptedAtRest(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	kid := f.keys.ActiveKID()
	signer, err := f.keys.signer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	priv := signer.priv

	var enc []byte
	var pubJWK json.RawMessage
	if err := f.pool.QueryRow(ctx, `SELECT private_key_enc, public_jwk FROM auth_signing_keys WHERE kid = $1`, kid).Scan(&enc, &pubJWK); err != nil {
		t.Fatal(err)
	}
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(priv)
	pkcs1 := x509.MarshalPKCS1PrivateKey(priv)
	secrets := map[string][]byte{
		"pkcs8 der": pkcs8, "pkcs1 der": pkcs1,
		"private exponent": priv.D.Bytes(), "prime p": priv.Primes[0].Bytes(), "prime q": priv.Primes[1].Bytes(),
	}
	for name, secret := range secrets {
		// Any 16-byte window of the secret in the row would be a leak.
		for i := 0; i+16 <= len(secret); i += 16 {
			if bytes.Contains(enc, secret[i:i+16]) || bytes.Contains(pubJWK, secret[i:i+16]) {
				t.Fatalf("%s appears in plain form in the row", name)
			}
		}
	}
	var doc map[string]any
	_ = json.Unmarshal(pubJWK, &doc)
	for _, member := range []string{"d", "p", "q", "dp", "dq", "qi"} {
		if _, ok := doc[member]; ok {
			t.Errorf("public_jwk has private member %q", member)
		}
	}
	if len(enc) != 12+len(pkcs8)+16 {
		t.Errorf("ciphertext is %d bytes, want nonce + %d + tag", len(enc), len(pkcs8))
	}

	// Another master key cannot load the keyring.
	cfg := f.cfg
	cfg.MasterKey = testMasterKey(2)
	other, err := NewKeyring(f.pool, cfg, f.clock, ids.V7{})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Reload(ctx); err == nil {
		t.Fatal("Reload with the wrong master key succeeded")
	}
	if err := other.EnsureActive(ctx); err == nil {
		t.Fatal("EnsureActive with the wrong master key succeeded")
	}

	// A ciphertext moved to another row (kid is the additional data) does not open.
	if _, err := f.keys.master.open(enc, uuid.NewString()); err == nil {
		t.Fatal("ciphertext opened under another kid")
	}
	if _, err := f.keys.master.open(enc, kid); err != nil {
		t.Fatalf("ciphertext does not open under its own kid: %v", err)
	}
}

func TestSigningRefusesWithoutActiveKey(t *testing.T) {
	pool := testenv.NewDatabase(t, testenv.Template{Name: "controlplane", Version: db.SchemaVersion(), Migrate: db.Migrate, Configure: db.ConfigurePool, AppRole: db.AppRole})
	cfg := DefaultConfig()
	cfg.MasterKey = testMasterKey(1)
	keys, err := NewKeyring(pool, cfg, clock.NewManual(t0), ids.V7{})
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(pool, cfg, keys, clock.NewManual(t0), ids.V7{})
	if _, _, err := svc.signAccess(context.Background(), Identity{UserID: uuid.New()}); !errors.Is(err, ErrNoActiveKey) {
		t.Fatalf("signing without a key: %v, want ErrNoActiveKey", err)
	}
	if _, err := NewKeyring(pool, Config{}, clock.Real{}, ids.V7{}); err == nil {
		t.Fatal("NewKeyring without a master key succeeded")
	}
}

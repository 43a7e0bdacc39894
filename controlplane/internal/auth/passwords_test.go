package auth

import (
	"context"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func withPrincipal(ctx context.Context, t AuthTokens) context.Context {
	return principal.With(ctx, t.Identity.Principal())
}

func TestPasswordRoundTrip(t *testing.T) {
	hash, err := HashPassword(testPassword)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hash, "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Errorf("hash %q does not carry the documented parameters", hash)
	}
	if strings.Contains(hash, testPassword) {
		t.Fatal("hash contains the password")
	}
	if !CheckPassword(testPassword, &hash) {
		t.Error("the right password does not match")
	}
	if CheckPassword(testPassword+"!", &hash) {
		t.Error("a wrong password matches")
	}
	if CheckPassword(testPassword, nil) || CheckPassword("", nil) {
		t.Error("a missing hash matches")
	}
	again, _ := HashPassword(testPassword)
	if again == hash {
		t.Error("two hashes of one password are equal (no salt?)")
	}
}

func TestPasswordPolicy(t *testing.T) {
	cases := []struct {
		password string
		ok       bool
	}{
		{strings.Repeat("a", 11), false},
		{strings.Repeat("a", 12), true},
		{strings.Repeat("é", 12), true}, // characters, not bytes
		{strings.Repeat("a", 256), true},
		{strings.Repeat("a", 257), false},
		{"", false},
	}
	for _, tc := range cases {
		_, err := HashPassword(tc.password)
		if tc.ok {
			wantCode(t, err, "")
			continue
		}
		wantCode(t, err, apierr.ValidationError)
		if e, _ := apierr.As(err); e.Details["field"] != "password" {
			t.Errorf("details = %v", e.Details)
		}
	}
}

func TestLogin(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alice := f.createUser(t, "alice", userOpts{tenant: true})
	f.createUser(t, "mallory", userOpts{status: "disabled"})
	f.createUser(t, "fedonly", userOpts{noPass: true})

	toks, err := f.svc.Login(ctx, "alice", testPassword)
	if err != nil {
		t.Fatal(err)
	}
	if toks.Identity.UserID != alice || toks.Identity.Role != "user" {
		t.Errorf("identity = %+v", toks.Identity)
	}
	wantCode(t, f.authenticate(toks.AccessToken), "")
	var actor, meta string
	if err := f.pool.QueryRow(ctx, `SELECT actor_user_id::text, metadata::text FROM audit_events WHERE action = 'user.login'`).Scan(&actor, &meta); err != nil {
		t.Fatal(err)
	}
	if actor != alice.String() || strings.Contains(meta, testPassword) || strings.Contains(meta, toks.RefreshToken) {
		t.Errorf("login audit actor=%s metadata=%s", actor, meta)
	}

	var message string
	for _, tc := range []struct{ name, user, pass string }{
		{"wrong password", "alice", testPassword + "x"},
		{"unknown user", "nobody", testPassword},
		{"disabled user", "mallory", testPassword},
		{"user without password", "fedonly", testPassword},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.svc.Login(ctx, tc.user, tc.pass)
			wantCode(t, err, apierr.TokenInvalid)
			e, _ := apierr.As(err)
			if message == "" {
				message = e.Message
			}
			if e.Message != message {
				t.Errorf("message %q differs from %q: a username oracle", e.Message, message)
			}
		})
	}
	if n := f.auditCount(t, "user.login"); n != 1 {
		t.Errorf("%d user.login rows, want 1", n)
	}
}

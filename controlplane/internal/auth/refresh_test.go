package auth

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestRefreshRotation(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.createUser(t, "alice", userOpts{tenant: true})
	first, err := f.svc.Login(ctx, "alice", testPassword)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first.RefreshToken, RefreshTokenPrefix) || len(first.RefreshToken) != len(RefreshTokenPrefix)+43 {
		t.Fatalf("refresh token %q: want grt_ + 43 base64url chars", first.RefreshToken)
	}
	// Only the hash is stored.
	var stored int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM auth_refresh_tokens WHERE token_hash = $1`, hashRefreshToken(first.RefreshToken)).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("stored hash rows = %d (%v)", stored, err)
	}

	f.clock.Advance(time.Minute)
	second, err := f.svc.Refresh(ctx, first.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	if second.RefreshToken == first.RefreshToken || second.AccessToken == first.AccessToken {
		t.Fatal("refresh returned the same tokens")
	}
	wantCode(t, f.authenticate(second.AccessToken), "")
	if !second.RefreshExpiresAt.Equal(f.clock.Now().Add(f.cfg.RefreshTokenTTL)) {
		t.Errorf("new refresh token expires %s", second.RefreshExpiresAt)
	}
	third, err := f.svc.Refresh(ctx, second.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	var families int
	if err := f.pool.QueryRow(ctx, `SELECT count(DISTINCT family_id) FROM auth_refresh_tokens`).Scan(&families); err != nil || families != 1 {
		t.Fatalf("%d families (%v), want 1", families, err)
	}

	// Reuse of a spent token revokes the whole family, newest token included.
	_, err = f.svc.Refresh(ctx, first.RefreshToken)
	wantCode(t, err, apierr.TokenInvalid)
	if n := f.auditCount(t, "auth.refresh_reuse_detected"); n != 1 {
		t.Fatalf("%d reuse audit rows, want 1", n)
	}
	_, err = f.svc.Refresh(ctx, third.RefreshToken)
	wantCode(t, err, apierr.TokenInvalid)
	var live int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM auth_refresh_tokens WHERE revoked_at IS NULL`).Scan(&live); err != nil || live != 0 {
		t.Fatalf("%d unrevoked tokens after reuse (%v), want 0", live, err)
	}
	// Presenting tokens of a revoked family again does not audit again.
	_, err = f.svc.Refresh(ctx, first.RefreshToken)
	wantCode(t, err, apierr.TokenInvalid)
	if n := f.auditCount(t, "auth.refresh_reuse_detected"); n != 1 {
		t.Fatalf("%d reuse audit rows, want still 1", n)
	}
}

func TestRefreshErrors(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id := f.createUser(t, "alice", userOpts{})
	toks, err := f.svc.IssueFor(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name  string
		token string
		want  apierr.Code
	}{
		{"unknown", RefreshTokenPrefix + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", apierr.TokenInvalid},
		{"no prefix", "AAAA", apierr.TokenInvalid},
		{"access token as refresh token", toks.AccessToken, apierr.TokenInvalid},
		{"empty", "", apierr.TokenInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.svc.Refresh(ctx, tc.token)
			wantCode(t, err, tc.want)
		})
	}

	t.Run("expired", func(t *testing.T) {
		f.clock.Set(toks.RefreshExpiresAt)
		_, err := f.svc.Refresh(ctx, toks.RefreshToken)
		wantCode(t, err, apierr.TokenExpired)
		f.clock.Set(t0)
	})
	t.Run("disabled user", func(t *testing.T) {
		toks, err := f.svc.IssueFor(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.pool.Exec(ctx, `UPDATE users SET status = 'disabled' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		_, err = f.svc.Refresh(ctx, toks.RefreshToken)
		wantCode(t, err, apierr.TokenInvalid)
		var revoked bool
		err = f.pool.QueryRow(ctx, `SELECT revoked_at IS NOT NULL FROM auth_refresh_tokens WHERE token_hash = $1`, hashRefreshToken(toks.RefreshToken)).Scan(&revoked)
		if err != nil || !revoked {
			t.Errorf("disabled user's family was not revoked (%v)", err)
		}
	})
}

func TestConcurrentRefreshExactlyOneWins(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id := f.createUser(t, "alice", userOpts{})
	toks, err := f.svc.IssueFor(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		errs     = make([]error, n)
		winner   AuthTokens
		winnerMu sync.Mutex
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out, err := f.svc.Refresh(ctx, toks.RefreshToken)
			errs[i] = err
			if err == nil {
				winnerMu.Lock()
				winner = out
				winnerMu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		wantCode(t, err, apierr.TokenInvalid)
	}
	if ok != 1 {
		t.Fatalf("%d refreshes succeeded, want exactly 1 (errors: %v)", ok, errs)
	}
	var used int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM auth_refresh_tokens WHERE used_at IS NOT NULL`).Scan(&used); err != nil || used != 1 {
		t.Fatalf("%d spent tokens (%v), want 1", used, err)
	}
	// The losers presented a spent token: reuse, so the winner's family is revoked too.
	_, err = f.svc.Refresh(ctx, winner.RefreshToken)
	wantCode(t, err, apierr.TokenInvalid)
}

func TestLogoutRevokesFamily(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alice := f.createUser(t, "alice", userOpts{})
	bob := f.createUser(t, "bob", userOpts{})
	toks, err := f.svc.IssueFor(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	next, err := f.svc.Refresh(ctx, toks.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	bobToks, err := f.svc.IssueFor(ctx, bob)
	if err != nil {
		t.Fatal(err)
	}

	// Bob cannot log Alice out; nothing changes and nothing is said.
	bobCtx := withPrincipal(ctx, bobToks)
	if err := f.svc.Logout(bobCtx, next.RefreshToken); err != nil {
		t.Fatal(err)
	}
	if f.auditCount(t, "user.logout") != 0 {
		t.Fatal("foreign logout audited")
	}

	aliceCtx := withPrincipal(ctx, next)
	if err := f.svc.Logout(aliceCtx, next.RefreshToken); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Refresh(ctx, next.RefreshToken)
	wantCode(t, err, apierr.TokenInvalid)
	if n := f.auditCount(t, "user.logout"); n != 1 {
		t.Fatalf("%d user.logout rows, want 1", n)
	}
	// Idempotent: again, or with an unknown token, is fine and audits nothing new.
	for _, tok := range []string{next.RefreshToken, RefreshTokenPrefix + "nope", "junk"} {
		if err := f.svc.Logout(aliceCtx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.auditCount(t, "user.logout"); n != 1 {
		t.Fatalf("%d user.logout rows, want still 1", n)
	}
	// Bob's session is untouched.
	if _, err := f.svc.Refresh(ctx, bobToks.RefreshToken); err != nil {
		t.Fatal(err)
	}
}

package auth

import (
	"context"
	"testing"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestVerifiedCacheKeepsExpiryExactAndCopies(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	user := f.createUser(t, "cache-user", userOpts{})
	toks, err := f.svc.IssueFor(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := f.authn.Verify(ctx, toks.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.authn.verified.entries) != 1 {
		t.Fatalf("not cached: %d entries", len(f.authn.verified.entries))
	}
	// A caller that changes its principal cannot change the next caller's.
	p1.Capabilities = append(p1.Capabilities, "platform.admin")
	p1.Username = "mallory"
	p2, err := f.authn.Verify(ctx, toks.AccessToken)
	if err != nil || p2.Username != "cache-user" || p2.Can("platform.admin") {
		t.Fatalf("cached principal was shared: %+v %v", p2, err)
	}
	// Past exp + leeway the cached result is not used: the token is expired.
	f.clock.Set(toks.AccessExpiresAt.Add(Leeway))
	if _, err := f.authn.Verify(ctx, toks.AccessToken); apierr.CodeOf(err) != apierr.TokenExpired {
		t.Fatalf("after expiry: %v", err)
	}
	// A different (tampered) token is never answered from the cache.
	if _, err := f.authn.Verify(ctx, toks.AccessToken+"x"); apierr.CodeOf(err) != apierr.TokenInvalid {
		t.Fatalf("tampered: %v", err)
	}
}

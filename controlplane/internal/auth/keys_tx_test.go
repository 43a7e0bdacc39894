package auth

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestSignInWithAStaleKeySetNeedsNoSecondConnection: a sign-in signs its access token
// inside its transaction. When the key set is stale it must be reloaded on that
// transaction's connection, not on a second one from the pool: concurrent sign-ins of
// one user queue on the TOTP factor's row lock, each holding a connection, and the one
// holding the lock used to wait for a free connection until the request deadline (503
// for all of them; seen in make test). A pool of one connection makes that wait certain.
func TestSignInWithAStaleKeySetNeedsNoSecondConnection(t *testing.T) {
	base := newFixture(t)
	cfg := base.pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 1, 0
	one, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(one.Close)
	f := newReplica(t, one, base.clock)
	user := f.createUser(t, "stale-keys", userOpts{tenant: true})

	for _, name := range []string{"issue", "password sign-in"} {
		f.clock.Advance(keyCacheMaxAge + time.Second) // the key set is stale again
		// A bound, not a timing claim: without the fix the sign-in waits for this.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var err error
		if name == "issue" {
			_, err = f.svc.IssueFor(ctx, user)
		} else {
			_, err = f.svc.Login(ctx, "stale-keys", testPassword)
		}
		cancel()
		if err != nil {
			t.Fatalf("%s with a stale key set on a one-connection pool: %v", name, err)
		}
	}
}

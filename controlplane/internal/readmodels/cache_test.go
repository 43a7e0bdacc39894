package readmodels_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/readmodels"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// flakyBalance answers the tenant's balance until failing is set.
type flakyBalance struct{ failing atomic.Bool }

func (f *flakyBalance) Balance(context.Context, uuid.UUID) (int64, string, error) {
	if f.failing.Load() {
		return 0, "", errors.New("ledger unavailable")
	}
	return 1234, "USD", nil
}

// meta.cache is truthful with either cache: hit, miss, bypass, and stale when a
// refresh fails and a kept answer exists; without a kept answer the failure is an error.
func TestShellCacheStates(t *testing.T) {
	e := newEnv(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	p := &principal.Principal{UserID: acme.AdminID, TenantID: acme.ID, TenantRole: principal.TenantRoleAdmin}

	rc := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rc.Close() })
	caches := map[string]readmodels.Cache{
		"memory": &readmodels.MemoryCache{Now: e.clk.Now},
		"redis":  readmodels.RedisCache{Client: rc, Prefix: "test:" + uuid.NewString() + ":"},
	}
	for name, cache := range caches {
		t.Run(name, func(t *testing.T) {
			bal := &flakyBalance{}
			svc := readmodels.New(readmodels.Deps{Pool: e.Pool, Clock: e.clk, IDs: e.App.IDs, Billing: e.App.Billing,
				Tenancy: e.App.Tenancy, Balance: bal, Cache: cache,
				Regions: readmodels.RegionsFunc(func(context.Context) ([]api.V3Region, error) { return []api.V3Region{}, nil })})
			ctx := context.Background()
			state := func(bypass bool) (string, error) {
				c, err := svc.ShellContext(ctx, p, nil, "", bypass)
				if err != nil {
					return "", err
				}
				if c.Balance == nil || c.Balance.AmountMinor != 1234 {
					t.Fatalf("balance %v", c.Balance)
				}
				return string(c.Meta.Cache), nil
			}
			for i, want := range []string{"miss", "hit", "bypass"} {
				if got, err := state(i == 2); err != nil || got != want {
					t.Fatalf("call %d: %s %v, want %s", i, got, err, want)
				}
			}
			e.clk.Advance(svc.CacheTTL + time.Second)
			bal.failing.Store(true)
			if got, err := state(false); err != nil || got != "stale" {
				t.Fatalf("failed refresh with a kept answer: %s %v, want stale", got, err)
			}
			if _, err := svc.ShellContext(ctx, p, nil, "", true); err == nil {
				t.Fatal("a bypass must not hide a failure behind the cache")
			}
			// After a forget (a dismissal) nothing is kept: the failure shows.
			if err := cache.Forget(ctx, p.UserID); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.ShellContext(ctx, p, nil, "", false); err == nil {
				t.Fatal("nothing kept and the refresh failed: want an error")
			}
			bal.failing.Store(false)
			if got, err := state(false); err != nil || got != "miss" {
				t.Fatalf("recovered: %s %v", got, err)
			}
		})
	}
}

// A cache that fails (Redis down) is an empty cache: the answer is computed, and says so.
func TestShellWithRedisDown(t *testing.T) {
	e := newEnv(t)
	_, padmin := e.PlatformAdmin(t)
	acme := e.NewTenant(t, padmin, "Acme")
	p := &principal.Principal{UserID: acme.AdminID, TenantID: acme.ID, TenantRole: principal.TenantRoleAdmin}
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rc.Close() })
	svc := readmodels.New(readmodels.Deps{Pool: e.Pool, Clock: e.clk, IDs: e.App.IDs, Billing: e.App.Billing,
		Tenancy: e.App.Tenancy, Balance: &flakyBalance{}, Cache: readmodels.RedisCache{Client: rc},
		Regions: readmodels.RegionsFunc(func(context.Context) ([]api.V3Region, error) { return []api.V3Region{}, nil })})
	for range 2 {
		c, err := svc.ShellContext(context.Background(), p, nil, "", false)
		if err != nil || c.Meta.Cache != "miss" || c.Tenant == nil || c.Tenant.ID != acme.ID {
			t.Fatalf("redis down: %v %+v", err, c.Meta)
		}
	}
}

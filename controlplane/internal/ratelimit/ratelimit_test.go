package ratelimit_test

import (
	"encoding/json"
	"io"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func limited(perMinute int, redisURL string) apitest.Option {
	return apitest.WithConfig(func(c *app.Config) {
		c.RateLimits = "api=" + strconv.Itoa(perMinute)
		c.RedisURL = redisURL
	})
}

func TestLimitAnswers429WithRetryAfter(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			url := ""
			if store == "redis" {
				url = "redis://" + testenv.StartRedis(t).Addr()
			}
			e := apitest.New(t, limited(3, url))
			for i := 1; i <= 3; i++ {
				resp := e.Do(e.Request("GET", "/api/v1/health", "", ""))
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: %d", i, resp.StatusCode)
				}
			}
			resp := e.Do(e.Request("GET", "/api/v1/health", "", ""))
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var env struct {
				Code string `json:"code"`
			}
			_ = json.Unmarshal(body, &env)
			if resp.StatusCode != 429 || env.Code != "rate_limit_exceeded" {
				t.Fatalf("4th request: %d %s", resp.StatusCode, body)
			}
			secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || secs < 1 || secs > 60 {
				t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
			}
			// Other groups keep their own budget.
			resp = e.Do(e.Request("GET", "/metrics", "", ""))
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("metrics limited too: %d", resp.StatusCode)
			}
		})
	}
}

func TestFailOpenWhenRedisIsDown(t *testing.T) {
	redis := testenv.StartRedis(t)
	e := apitest.New(t, limited(2, "redis://"+redis.Addr()))
	counter := e.App.Metrics.RateLimitFailOpen

	resp := e.Do(e.Request("GET", "/api/v1/health", "", ""))
	resp.Body.Close()
	if resp.StatusCode != 200 || testutil.ToFloat64(counter) != 0 {
		t.Fatalf("with redis: %d, fail-open %v", resp.StatusCode, testutil.ToFloat64(counter))
	}
	redis.Stop()
	// Past the limit of 2, yet every request passes while the store is down.
	for i := 0; i < 5; i++ {
		resp := e.Do(e.Request("GET", "/api/v1/health", "", ""))
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d with redis down: %d", i, resp.StatusCode)
		}
	}
	if got := testutil.ToFloat64(counter); got != 5 {
		t.Fatalf("api_ratelimit_fail_open_total = %v, want 5", got)
	}
}

package ratelimit_test

import (
	"encoding/json"
	"io"
	"strconv"
	"testing"

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

// Redis outages (killed, frozen) are in outage_test.go.

package e2e_test

import (
	"context"
	"net/http"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// BenchmarkCLIAllocList is `make bench`'s CLI figure: the wall time of `gantry alloc list`
// from process start to exit against a local control plane (the goal is 100 ms), with
// two baselines from the same run: the binary starting and exiting without the network
// (`gantry --version`), and the same list call made in-process with the generated client.
// It reports p50 and p99 of each in ms (b.N runs; -benchtime 30x in make bench).
func BenchmarkCLIAllocList(b *testing.B) {
	w := startBenchWorld(b)
	u := newCLIUser(b, w.url)
	if _, e, code := u.run(apitest.Password+"\n", "login", "-u", w.username, "--password-stdin"); code != 0 {
		b.Fatalf("login: %s", e)
	}
	u.ok("project", "use", w.project.String())
	u.ok("alloc", "list") // warm: the first run may refresh nothing, but pages the binary in

	measure := func(b *testing.B, run func()) {
		times := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			run()
			times = append(times, time.Since(start))
		}
		b.StopTimer()
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(times[(len(times)*99)/100].Microseconds())/1000, "p99-ms")
	}
	b.Run("gantry-alloc-list", func(b *testing.B) {
		measure(b, func() {
			if _, e, code := u.run("", "alloc", "list"); code != 0 {
				b.Fatalf("alloc list: %s", e)
			}
		})
	})
	b.Run("baseline-gantry-version", func(b *testing.B) {
		measure(b, func() {
			if err := exec.Command(u.bin, "--version").Run(); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("baseline-in-process-client", func(b *testing.B) {
		c := w.client
		measure(b, func() {
			r, err := c.ListAllocationsWithResponse(context.Background(), &api.ListAllocationsParams{XProjectID: w.project})
			if err != nil || r.StatusCode() != 200 {
				b.Fatalf("list: %v", err)
			}
		})
	})
}

type benchWorld struct {
	url      string
	username string
	project  uuid.UUID
	client   *api.ClientWithResponses
}

// startBenchWorld is a control plane with a tenant and its default project (no node:
// the list is empty, so the figure is the CLI's own cost plus one API round trip).
func startBenchWorld(b *testing.B) benchWorld {
	env := apitest.New(b)
	_, admin := env.PlatformAdmin(b)
	tenant := env.NewTenant(b, admin, "Bench")
	// A plain generated client (env.Client validates every answer against the contract,
	// which is not what a user's call pays).
	c, err := api.NewClientWithResponses(env.Server.URL, api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+tenant.AdminToken)
		return nil
	}))
	if err != nil {
		b.Fatal(err)
	}
	return benchWorld{url: env.Server.URL, username: tenant.AdminUsername, project: tenant.DefaultProject, client: c}
}

package maas_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/jobs"
	"github.com/gantry-gpu/gantry/controlplane/internal/maas/maastest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// The control plane loses its deploy call's answer (MAAS deployed the machine, the
// answer never arrived: what a crash between the call and the commit leaves), is then
// stopped mid-workflow and replaced by a fresh job runner: the workflow resumes where it
// was, with no second deploy and no second node record.
func TestRestartMidStepResumesWithoutSecondDeploy(t *testing.T) {
	var lost atomic.Bool
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("op") == "deploy" && !lost.Load() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				if rec.Code < 300 {
					lost.Store(true)
					http.Error(w, "connection reset", http.StatusInternalServerError)
					return
				}
				w.WriteHeader(rec.Code)
				_, _ = w.Write(rec.Body.Bytes())
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	f := setupSim(t, nil, maastest.Durations{Deploying: 500 * time.Millisecond}, wrap)
	sys := f.sim.AddMachine(maastest.MachineSpec{})
	r := f.onboard(t, sys)
	if r.StatusCode() != http.StatusAccepted {
		t.Fatalf("onboard: %d %s", r.StatusCode(), r.Body)
	}
	o := f.waitFor(t, *r.JSON202, func(o api.MaasOnboarding) bool {
		return deref(o.CurrentStep) == "wait_deployed" || deref(o.CurrentStep) == "wait_enrolled"
	})
	if !lost.Load() {
		t.Fatal("the deploy answer was not dropped")
	}
	// "Restart": the replica's runner stops; a new one (as a restarted process builds)
	// takes over the same database.
	f.stop()
	r2, err := jobs.New(f.e.Pool, jobs.Config{FetchPollInterval: 50 * time.Millisecond, StopTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.e.App.Maas.Register(r2.Workers(), nil)
	f.e.App.Maas.Jobs = r2
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r2.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	o = f.waitFor(t, o, atStep("wait_enrolled"))
	if got := deploys(f.sim, sys); got != 1 {
		t.Errorf("machine deployed %d times, want 1", got)
	}
	if n := f.e.Count(t, `SELECT count(*) FROM nodes`); n != 1 {
		t.Errorf("%d node records, want 1", n)
	}
	dep := o.Steps[3]
	if dep.Name != "deploy" || dep.State != api.MaasWorkflowStepStateSucceeded {
		t.Errorf("deploy step: %+v", dep)
	}
}

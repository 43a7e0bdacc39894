package allocations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// sample stores one telemetry sample per GPU of the node (index order) at the clock's
// time. The clock moves past node administration's coalescing interval first, so every
// sample is stored.
func (w *world) sample(t *testing.T, clk *clock.Manual, node uuid.UUID, name string, utils ...uint32) {
	t.Helper()
	clk.Advance(31 * time.Second)
	var ms []fleet.GPUMetrics
	for i, u := range utils {
		ms = append(ms, fleet.GPUMetrics{UUID: gpuUUID(name, i), UtilizationPercent: u, Healthy: true, SampledAt: clk.Now()})
	}
	if err := w.App.Nodes.NodeTelemetry(context.Background(), node, ms); err != nil {
		t.Fatal(err)
	}
}

func gpuUUID(node string, i int) string { return fmt.Sprintf("GPU-%s-%d", node, i) }

func (w *world) underSince(t *testing.T, id uuid.UUID) *time.Time {
	t.Helper()
	var since *time.Time
	if err := w.Pool.QueryRow(context.Background(), `SELECT under_threshold_since FROM allocations WHERE id = $1`, id).Scan(&since); err != nil {
		t.Fatal(err)
	}
	return since
}

func (w *world) evaluate(t *testing.T) allocations.IdleStats {
	t.Helper()
	st, err := w.App.Allocations.EvaluateIdle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// active <-> idle on the GPU utilization of every GPU of the allocation, with the
// under-threshold clock in the database, samples that stop arriving counted as no
// evidence, and several evaluators at once moving it once.
func TestIdleDetection(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := context.Background()
	w.sku(t, "h100-80gb-sxm.2x", 2)
	node := w.node(t, "n", 2)
	r, err := w.create(w.Alice, w.Acme.DefaultProject, "", api.CreateAllocationJSONRequestBody{Name: "two", Sku: "h100-80gb-sxm.2x"})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create: %v %s", err, r.Body)
	}
	a := *r.JSON201
	w.activate(t, node, a.ID)
	cfg := w.App.Allocations.Config
	if cfg.IdleUtilizationPercent != 5 || cfg.IdleAfter != 30*time.Minute {
		t.Fatalf("defaults: %+v", cfg)
	}

	// No samples yet: no evidence.
	if st := w.evaluate(t); st.Evaluated != 1 || st.Unknown != 1 || w.underSince(t, a.ID) != nil {
		t.Fatalf("without samples: %+v", st)
	}
	// One GPU busy, one quiet: not idle.
	w.sample(t, clk, node, "n", 2, 60)
	if st := w.evaluate(t); st.Marked != 0 || w.underSince(t, a.ID) != nil {
		t.Fatalf("one busy GPU: %+v", st)
	}
	// Both quiet: the clock starts (at the evaluation's time), and holds while quiet.
	w.sample(t, clk, node, "n", 2, 4)
	started := clk.Now()
	if st := w.evaluate(t); st.Marked != 1 {
		t.Fatalf("both quiet: %+v", st)
	}
	if since := w.underSince(t, a.ID); since == nil || !since.Equal(started) {
		t.Fatalf("under since: %v, want %v", since, started)
	}
	clk.Advance(10 * time.Minute)
	w.sample(t, clk, node, "n", 0, 3)
	if st := w.evaluate(t); st.Marked != 0 || st.WentIdle != 0 || w.status(t, a.ID).Status != "active" {
		t.Fatalf("10 minutes quiet: %+v", st)
	}
	// A burst (exactly the threshold counts as busy) clears the clock.
	w.sample(t, clk, node, "n", 5, 0)
	if st := w.evaluate(t); st.Cleared != 1 || w.underSince(t, a.ID) != nil {
		t.Fatalf("burst: %+v", st)
	}
	// Quiet again; the node then stops reporting: a stale sample is no evidence.
	w.sample(t, clk, node, "n", 1, 1)
	w.evaluate(t)
	clk.Advance(cfg.IdleSampleMaxAge + time.Second)
	if st := w.evaluate(t); st.Unknown != 1 || st.Cleared != 1 || w.underSince(t, a.ID) != nil {
		t.Fatalf("stale samples: %+v", st)
	}

	// Quiet for the whole IdleAfter, with two evaluators (two replicas) at once: one
	// starts the clock, one moves it to idle, once.
	w.sample(t, clk, node, "n", 1, 1)
	both := func() allocations.IdleStats {
		var mu sync.Mutex
		var sum allocations.IdleStats
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := w.evaluate(t)
				mu.Lock()
				sum.Marked += st.Marked
				sum.WentIdle += st.WentIdle
				sum.BecameBusy += st.BecameBusy
				mu.Unlock()
			}()
		}
		wg.Wait()
		return sum
	}
	if st := both(); st.Marked != 1 {
		t.Fatalf("concurrent mark: %+v", st)
	}
	clk.Advance(cfg.IdleAfter - 2*time.Minute)
	w.sample(t, clk, node, "n", 0, 0)
	if st := w.evaluate(t); st.WentIdle != 0 {
		t.Fatalf("before IdleAfter: %+v", st)
	}
	clk.Advance(2 * time.Minute)
	w.sample(t, clk, node, "n", 0, 0)
	if st := both(); st.WentIdle != 1 {
		t.Fatalf("concurrent went idle: %+v", st)
	}
	got := w.status(t, a.ID)
	if got.Status != "idle" || w.openUsage(t, a.ID) != 1 || w.underSince(t, a.ID) != nil {
		t.Fatalf("idle: %+v (idle stays billed)", got)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1 AND event = 'went_idle' AND actor_type = 'system'`, a.ID); n != 1 {
		t.Fatalf("went_idle events: %d", n)
	}
	// Still quiet: a repeat, nothing written.
	before := w.writes(t)
	w.sample(t, clk, node, "n", 0, 0)
	if st := w.evaluate(t); st.WentIdle != 0 || st.Marked != 0 {
		t.Fatalf("idle and quiet: %+v", st)
	}
	if after := w.writes(t); after != before {
		t.Fatalf("a quiet idle allocation wrote: %v -> %v", before, after)
	}
	// Stale samples leave an idle allocation idle.
	clk.Advance(cfg.IdleSampleMaxAge + time.Second)
	if st := w.evaluate(t); st.Unknown != 1 || w.status(t, a.ID).Status != "idle" {
		t.Fatalf("idle with stale samples: %+v", st)
	}
	// One GPU busy: back to active, once.
	w.sample(t, clk, node, "n", 0, 90)
	if st := both(); st.BecameBusy != 1 {
		t.Fatalf("became busy: %+v", st)
	}
	if got := w.status(t, a.ID); got.Status != "active" {
		t.Fatalf("busy: %+v", got)
	}

	// An idle allocation restarts; the restart resets the observation.
	w.sample(t, clk, node, "n", 0, 0)
	w.evaluate(t)
	clk.Advance(cfg.IdleAfter)
	w.sample(t, clk, node, "n", 0, 0)
	w.evaluate(t)
	if got := w.status(t, a.ID); got.Status != "idle" {
		t.Fatalf("idle again: %+v", got)
	}
	rr := w.restart(w.Alice, w.Acme.DefaultProject, a.ID)
	if rr.StatusCode() != 200 || rr.JSON200.Status != "restarting" {
		t.Fatalf("restart an idle allocation: %d %s", rr.StatusCode(), rr.Body)
	}
	// Restarting is neither active nor idle: the evaluator leaves it alone.
	if st := w.evaluate(t); st.Evaluated != 0 {
		t.Fatalf("restarting evaluated: %+v", st)
	}
	if err := w.report(t, node, w.task(t, a.ID, allocations.TaskRestart), true, ""); err != nil {
		t.Fatal(err)
	}
	if w.underSince(t, a.ID) != nil {
		t.Fatal("the restart kept the old observation")
	}
	_ = ctx
}

package allocations_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
)

// clockWorld is a world on a manual clock (mid-month, so periods do not roll over) with
// access tokens that outlive the hours the tests move the clock by.
func clockWorld(t *testing.T, maxPerProject int, more ...apitest.Option) (*world, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(time.Date(2030, 6, 10, 10, 0, 0, 0, time.UTC))
	opts := append([]apitest.Option{
		apitest.WithOptions(func(o *app.Options) { o.Clock = clk }),
		apitest.WithConfig(func(c *app.Config) { c.Auth.AccessTokenTTL = 72 * time.Hour }),
	}, more...)
	return newWorldWith(t, maxPerProject, opts...), clk
}

// startStops runs the stop consumer on the test's events stream until the test ends.
func (w *world) startStops(t *testing.T) {
	t.Helper()
	c := &allocations.StopConsumer{
		Svc: w.App.Allocations, JS: w.App.JS, Stream: w.App.Config.EventsStream, SubjectPrefix: w.App.Config.EventsSubjectPrefix,
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Created before anything is published: the consumer starts at new events.
	if _, err := c.Ensure(ctx); err != nil {
		cancel()
		t.Fatalf("stop consumer: %v", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// publish relays every pending outbox event to JetStream.
func (w *world) publish(t *testing.T) {
	t.Helper()
	if _, err := w.App.Relay.Drain(context.Background()); err != nil {
		t.Fatalf("relay: %v", err)
	}
}

// waitStatus waits until the allocation (of any project) has status, or fails.
func (w *world) waitStatus(t *testing.T, id uuid.UUID, status string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got string
		if err := w.Pool.QueryRow(context.Background(), `SELECT status FROM allocations WHERE id = $1`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("allocation %s is %s, still not %s", id, got, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *world) row(t *testing.T, id uuid.UUID) (status string, reason *string) {
	t.Helper()
	if err := w.Pool.QueryRow(context.Background(), `SELECT status, status_reason FROM allocations WHERE id = $1`, id).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	return status, reason
}

func (w *world) createIn(t *testing.T, c *api.ClientWithResponses, project uuid.UUID, name string) api.Allocation {
	t.Helper()
	r, err := w.create(c, project, "", api.CreateAllocationJSONRequestBody{Name: name, Sku: sku1x})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("create %s: %v %s", name, err, r.Body)
	}
	return *r.JSON201
}

// A project budget in suspend mode reaches 100 %: budgets enqueues
// budget.suspend_requested, the relay publishes it to JetStream, and the stop consumer
// stops that project's running allocations (billing closes, a stop task goes out) and
// releases the one still being set up. Another project and another tenant are
// untouched; a second delivery changes nothing; a stopped allocation cannot restart
// while the budget is exhausted, and can still be released.
func TestBudgetSuspendStopsTheProjectsAllocations(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 8)
	proj := w.Acme.DefaultProject
	pr, err := w.Alice.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectRequest{Name: "research"})
	if err != nil || pr.StatusCode() != 201 {
		t.Fatalf("project: %v %s", err, pr.Body)
	}
	research := pr.JSON201.Project.ID
	other := w.NewTenant(t, w.rootToken(t), "Other")
	oc := w.Client(other.AdminToken)
	w.addKey(t, oc)
	w.credit(t, other.ID, 1_000_000)

	a1 := w.createIn(t, w.Alice, proj, "a1")
	a2 := w.createIn(t, w.Alice, proj, "a2")
	setup := w.createIn(t, w.Alice, proj, "still-provisioning")
	b1 := w.createIn(t, w.Alice, research, "b1")
	o1 := w.createIn(t, oc, other.DefaultProject, "o1")
	for _, a := range []api.Allocation{a1, a2, b1, o1} {
		w.activate(t, node, a.ID)
	}
	// 1 USD a month for the default project, suspend mode.
	mode := api.BillingBudgetEnforcementModeSuspend
	br, err := w.Alice.CreateBillingBudgetWithResponse(ctx, &api.CreateBillingBudgetParams{}, api.BillingBudgetCreateRequest{
		Name: ptr("cap"), Amount: api.Money{AmountMinor: 100, Currency: "USD"}, Period: api.BillingBudgetCreateRequestPeriodMonthly,
		ScopeType: api.BillingBudgetScopeTypeProject, ProjectID: &proj, EnforcementMode: &mode,
	})
	if err != nil || br.StatusCode() != 201 {
		t.Fatalf("budget: %v %s", err, br.Body)
	}
	budgetID := br.JSON201.ID

	w.startStops(t)
	clk.Advance(time.Hour)
	if _, err := w.App.Billing.RateRunning(ctx, clk.Now(), 500); err != nil {
		t.Fatal(err)
	}
	ev, err := w.App.Budgets.Evaluate(ctx, w.Acme.ID)
	if err != nil || ev.SuspendRequested != 1 {
		t.Fatalf("evaluate: %+v %v", ev, err)
	}
	w.publish(t)
	w.waitStatus(t, a1.ID, "stopped")
	w.waitStatus(t, a2.ID, "stopped")
	w.waitStatus(t, setup.ID, "releasing")
	// The stop request is recorded after the moves; wait for it before counting.
	deadline := time.Now().Add(30 * time.Second)
	for w.count(t, `SELECT count(*) FROM allocation_stop_requests`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("stop request not recorded")
		}
		time.Sleep(20 * time.Millisecond)
	}

	want := "budget_suspend: " + budgetID.String()
	for _, a := range []api.Allocation{a1, a2} {
		if _, reason := w.row(t, a.ID); reason == nil || *reason != want {
			t.Fatalf("reason of %s: %v", a.Name, reason)
		}
		if n := w.openUsage(t, a.ID); n != 0 {
			t.Fatalf("%s still billed: %d open", a.Name, n)
		}
		if n := w.tasks(t, a.ID, allocations.TaskStop); n != 1 {
			t.Fatalf("%s stop tasks: %d", a.Name, n)
		}
		if n := w.count(t, `SELECT count(*) FROM allocation_events WHERE allocation_id = $1 AND event = 'stop' AND actor_type = 'system' AND reason = $2`, a.ID, want); n != 1 {
			t.Fatalf("%s stop events: %d", a.Name, n)
		}
		// Stopped keeps the GPUs (release is still possible).
		if n := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, a.ID); n != 1 {
			t.Fatalf("%s GPUs: %d", a.Name, n)
		}
	}
	if _, reason := w.row(t, setup.ID); reason == nil || *reason != want {
		t.Fatalf("reason of the released one: %v", reason)
	}
	for _, a := range []api.Allocation{b1, o1} {
		if st, _ := w.row(t, a.ID); st != "active" || w.openUsage(t, a.ID) != 1 {
			t.Fatalf("%s out of scope was touched: %s, %d open", a.Name, st, w.openUsage(t, a.ID))
		}
	}

	// A redelivery of the same event is recognised; a repeat of the request without an
	// event id finds nothing left to do. Neither writes anything.
	var eventID uuid.UUID
	if err := w.Pool.QueryRow(ctx, `SELECT event_id FROM allocation_stop_requests`).Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	before := w.writes(t)
	req := allocations.StopRequest{EventID: eventID, EventType: allocations.EventBudgetSuspendRequested, TenantID: w.Acme.ID,
		ProjectID: uuid.NullUUID{UUID: proj, Valid: true}, Reason: want}
	if res, err := w.App.Allocations.ApplyStopRequest(ctx, req); err != nil || !res.Repeat {
		t.Fatalf("redelivery: %+v %v", res, err)
	}
	req.EventID = uuid.Nil
	if res, err := w.App.Allocations.ApplyStopRequest(ctx, req); err != nil || res.Stopped != 0 || res.Released != 0 {
		t.Fatalf("repeat: %+v %v", res, err)
	}
	if after := w.writes(t); after != before {
		t.Fatalf("a repeated stop request wrote: %v -> %v", before, after)
	}

	// stopped -> restart runs the launch's money checks again: the budget still blocks.
	r := w.restart(w.Alice, proj, a1.ID)
	wantError(t, r.Body, r.StatusCode(), 409, "invalid_request", "budget_exceeded")
	if st, _ := w.row(t, a1.ID); st != "stopped" {
		t.Fatalf("a refused restart moved it: %s", st)
	}
	// Release stays possible.
	rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a1.ID, &api.ReleaseAllocationParams{XProjectID: proj})
	if rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("release a stopped allocation: %d %s", rel.StatusCode(), rel.Body)
	}
}

// A wallet's runway falls under the floor: billing enqueues billing.runway_exhausted
// and the stop consumer stops that tenant's allocations billed in the wallet's currency;
// another tenant's keep running. A stopped allocation restarts only when the wallet
// covers the minimum runway again, and then bills again once active.
func TestRunwayExhaustionStopsTheTenantsAllocations(t *testing.T) {
	w, clk := clockWorld(t, 16)
	ctx := context.Background()
	node := w.node(t, "n", 8)
	// 10 USD: two GPUs at 3.60 USD an hour each pass the 1h launch runway.
	thin := w.NewTenant(t, w.rootToken(t), "Thin")
	tc := w.Client(thin.AdminToken)
	w.addKey(t, tc)
	w.credit(t, thin.ID, 1000)
	t1 := w.createIn(t, tc, thin.DefaultProject, "t1")
	t2 := w.createIn(t, tc, thin.DefaultProject, "t2")
	rich := w.mustCreate(t, "rich")
	for _, a := range []api.Allocation{t1, t2, rich} {
		w.activate(t, node, a.ID)
	}
	w.startStops(t)

	// After 80 minutes 9.60 USD are used: 0.40 USD left at 7.20 USD an hour last 200 s,
	// under the 10 minute floor.
	clk.Advance(80 * time.Minute)
	blocked, _, err := w.App.Billing.WatchRunway(ctx)
	if err != nil || blocked != 1 {
		t.Fatalf("runway watch: %d %v", blocked, err)
	}
	w.publish(t)
	w.waitStatus(t, t1.ID, "stopped")
	w.waitStatus(t, t2.ID, "stopped")
	for _, a := range []api.Allocation{t1, t2} {
		if _, reason := w.row(t, a.ID); reason == nil || *reason != "runway_exhausted" {
			t.Fatalf("reason: %v", reason)
		}
		if n := w.openUsage(t, a.ID); n != 0 {
			t.Fatalf("still billed: %d", n)
		}
	}
	if st, _ := w.row(t, rich.ID); st != "active" || w.openUsage(t, rich.ID) != 1 {
		t.Fatalf("another tenant's allocation was touched: %s", st)
	}

	// 0.40 USD do not cover an hour of one GPU: 402.
	r := w.restart(tc, thin.DefaultProject, t1.ID)
	wantError(t, r.Body, r.StatusCode(), 402, "insufficient_balance", "")
	// Topped up, it restarts, and billing resumes with a new run once it is active.
	w.credit(t, thin.ID, 100_000)
	r = w.restart(tc, thin.DefaultProject, t1.ID)
	if r.StatusCode() != 200 || r.JSON200.Status != "restarting" {
		t.Fatalf("restart after top-up: %d %s", r.StatusCode(), r.Body)
	}
	if n := w.openUsage(t, t1.ID); n != 0 {
		t.Fatalf("billed while restarting from stopped: %d", n)
	}
	if err := w.report(t, node, w.task(t, t1.ID, allocations.TaskRestart), true, `{"host":"10.7.0.1","port":22,"user":"gantry-a1"}`); err != nil {
		t.Fatal(err)
	}
	if st, _ := w.row(t, t1.ID); st != "active" || w.openUsage(t, t1.ID) != 1 {
		t.Fatalf("after restart: %s, %d open", st, w.openUsage(t, t1.ID))
	}
	if n := w.count(t, `SELECT count(*) FROM billing_usage_records WHERE source_id = $1`, t1.ID); n != 2 {
		t.Fatalf("usage runs: %d", n)
	}
}

// Malformed events are refused, not retried; well-formed ones name their scope.
func TestStopRequestFromEvent(t *testing.T) {
	tenant, project, budget := uuid.New(), uuid.New(), uuid.New()
	id := uuid.New()
	r, err := allocations.StopRequestFromEvent(allocations.EventBudgetSuspendRequested, id,
		[]byte(`{"budget_id":"`+budget.String()+`","tenant_id":"`+tenant.String()+`","project_id":"`+project.String()+`","scope_type":"project"}`))
	if err != nil || r.TenantID != tenant || r.ProjectID.UUID != project || !r.ProjectID.Valid || r.EventID != id || r.Reason != "budget_suspend: "+budget.String() {
		t.Fatalf("project budget: %+v %v", r, err)
	}
	r, err = allocations.StopRequestFromEvent(allocations.EventBudgetSuspendRequested, uuid.Nil,
		[]byte(`{"budget_id":"`+budget.String()+`","tenant_id":"`+tenant.String()+`","project_id":null,"scope_type":"tenant","event_id":"`+id.String()+`"}`))
	if err != nil || r.ProjectID.Valid || r.EventID != id {
		t.Fatalf("tenant budget: %+v %v", r, err)
	}
	r, err = allocations.StopRequestFromEvent(allocations.EventRunwayExhausted, id, []byte(`{"tenant_id":"`+tenant.String()+`","currency":"EUR"}`))
	if err != nil || r.Currency != "EUR" || r.Reason != "runway_exhausted" || r.ProjectID.Valid {
		t.Fatalf("runway: %+v %v", r, err)
	}
	for _, bad := range []struct{ typ, body string }{
		{allocations.EventRunwayExhausted, `not json`},
		{allocations.EventRunwayExhausted, `{"currency":"USD"}`},
		{allocations.EventRunwayExhausted, `{"tenant_id":"` + tenant.String() + `"}`},
		{allocations.EventBudgetSuspendRequested, `{"tenant_id":"` + tenant.String() + `","scope_type":"tenant"}`},
		{allocations.EventBudgetSuspendRequested, `{"tenant_id":"` + tenant.String() + `","budget_id":"` + budget.String() + `","scope_type":"project"}`},
		{"budget.created", `{"tenant_id":"` + tenant.String() + `"}`},
	} {
		if _, err := allocations.StopRequestFromEvent(bad.typ, id, []byte(bad.body)); err == nil {
			t.Errorf("%s %s accepted", bad.typ, bad.body)
		}
	}
}

// A stop request applies the lifecycle's stop to every status it allows (active, idle,
// restarting, restart_failed -> stopped, usage closed), releases what is still being set
// up (requested, provisioning), repeats nothing on stopped, and leaves the release flow
// and final statuses alone.
func TestStopRequestOnEveryStatus(t *testing.T) {
	w := newWorld(t, 32)
	ctx := context.Background()
	node := w.node(t, "n", 16)
	proj := w.Acme.DefaultProject
	mk := func(name string) api.Allocation { return w.mustCreate(t, name) }

	requested := mk("requested")
	provisioning := mk("provisioning")
	if _, err := w.Pool.Exec(ctx, `UPDATE allocations SET status = 'provisioning' WHERE id = $1`, provisioning.ID); err != nil {
		t.Fatal(err)
	}
	active := mk("active")
	w.activate(t, node, active.ID)
	idle := mk("idle")
	w.activate(t, node, idle.ID)
	if _, err := w.Pool.Exec(ctx, `UPDATE allocations SET status = 'idle' WHERE id = $1`, idle.ID); err != nil {
		t.Fatal(err)
	}
	restarting := mk("restarting")
	w.activate(t, node, restarting.ID)
	if r := w.restart(w.Alice, proj, restarting.ID); r.StatusCode() != 200 {
		t.Fatalf("restart: %s", r.Body)
	}
	restartFailed := mk("restart-failed")
	w.activate(t, node, restartFailed.ID)
	if r := w.restart(w.Alice, proj, restartFailed.ID); r.StatusCode() != 200 {
		t.Fatalf("restart: %s", r.Body)
	}
	if err := w.report(t, node, w.task(t, restartFailed.ID, allocations.TaskRestart), false, ""); err != nil {
		t.Fatal(err)
	}
	releasing := mk("releasing")
	w.activate(t, node, releasing.ID)
	if r, _ := w.Alice.ReleaseAllocationWithResponse(ctx, releasing.ID, &api.ReleaseAllocationParams{XProjectID: proj}); r.StatusCode() != 200 {
		t.Fatalf("release: %s", r.Body)
	}
	releaseFailed := mk("release-failed")
	w.activate(t, node, releaseFailed.ID)
	if r, _ := w.Alice.ReleaseAllocationWithResponse(ctx, releaseFailed.ID, &api.ReleaseAllocationParams{XProjectID: proj}); r.StatusCode() != 200 {
		t.Fatalf("release: %s", r.Body)
	}
	if err := w.report(t, node, w.task(t, releaseFailed.ID, allocations.TaskRelease), false, ""); err != nil {
		t.Fatal(err)
	}
	failed := mk("failed")
	if err := w.report(t, node, w.task(t, failed.ID, allocations.TaskProvision), false, ""); err != nil {
		t.Fatal(err)
	}

	req := allocations.StopRequest{EventID: uuid.New(), EventType: allocations.EventRunwayExhausted, TenantID: w.Acme.ID, Currency: "USD", Reason: "runway_exhausted"}
	res, err := w.App.Allocations.ApplyStopRequest(ctx, req)
	if err != nil || res.Stopped != 4 || res.Released != 2 || res.Repeat {
		t.Fatalf("stop request: %+v %v", res, err)
	}
	want := map[uuid.UUID]string{
		requested.ID: "releasing", provisioning.ID: "releasing", active.ID: "stopped", idle.ID: "stopped",
		restarting.ID: "stopped", restartFailed.ID: "stopped", releasing.ID: "releasing", releaseFailed.ID: "release_failed",
		failed.ID: "failed",
	}
	for id, status := range want {
		if st, _ := w.row(t, id); st != status {
			t.Errorf("%s: %s, want %s", id, st, status)
		}
		if status == "stopped" && w.openUsage(t, id) != 0 {
			t.Errorf("%s stopped but still billed", id)
		}
	}
	// Another request finds the stopped ones stopped (a repeat) and writes nothing.
	before := w.writes(t)
	req.EventID = uuid.New()
	if res, err := w.App.Allocations.ApplyStopRequest(ctx, req); err != nil || res.Stopped != 0 || res.Released != 0 {
		t.Fatalf("second request: %+v %v", res, err)
	}
	if after := w.writes(t); after != before {
		t.Fatalf("a request with nothing to stop wrote: %v -> %v", before, after)
	}
	// A request in another currency touches nothing.
	req.EventID, req.Currency = uuid.New(), "EUR"
	if res, err := w.App.Allocations.ApplyStopRequest(ctx, req); err != nil || res.Stopped != 0 || res.Released != 0 {
		t.Fatalf("other currency: %+v %v", res, err)
	}
}

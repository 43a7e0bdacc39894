package sharedruntimes_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/sharedruntimes"
	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fakeWorkers stands in for the instances service (tested on its own with real node
// agents in apps/instances): it writes app instance rows the way a launch does, and a
// stop moves a live one to stopped. The tests drive instance states as the agents'
// reports would.
type fakeWorkers struct {
	e       *apitest.Env
	mu      sync.Mutex
	stopped []uuid.UUID
}

func (f *fakeWorkers) StartWorker(ctx context.Context, p *principal.Principal, owner projectctx.Project, w sharedruntimes.WorkerSpec) (uuid.UUID, uuid.UUID, error) {
	id, node := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	_, err := db.Querier(ctx, f.e.Pool).Exec(ctx, `INSERT INTO app_instances (id, tenant_id, project_id, owner_user_id, name, app_slug, app_version,
			app_name, allocation_id, node_id, port, state, run_spec, shared_runtime_id, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'App', $8, $9, 8888, 'requested', '{}', $10, now(), now())`,
		id, owner.TenantID, owner.ID, p.UserID, w.Name, w.AppSlug, w.Version, w.AllocationID, node, w.RuntimeID)
	return id, node, err
}

func (f *fakeWorkers) StopWorker(ctx context.Context, _ *principal.Principal, _ projectctx.Project, id uuid.UUID) error {
	f.mu.Lock()
	f.stopped = append(f.stopped, id)
	f.mu.Unlock()
	_, err := db.Querier(ctx, f.e.Pool).Exec(ctx, `UPDATE app_instances SET state = 'stopped' WHERE id = $1 AND state NOT IN ('stopped', 'failed')`, id)
	return err
}

func want(t *testing.T, a apitest.Answer, status int, code, reason string) {
	t.Helper()
	if a.Status != status || (code != "" && a.Code() != code) || (reason != "" && a.Reason() != reason) {
		t.Fatalf("got %d %s/%s, want %d %s/%s: %s", a.Status, a.Code(), a.Reason(), status, code, reason, a.Raw)
	}
}

type fixture struct {
	e             *apitest.Env
	admin         string
	owner, x, y   apitest.Tenant
	workers       *fakeWorkers
	svc           *sharedruntimes.Service
	runtime       string
	ctx           context.Context
	principalOf   func(t apitest.Tenant) *principal.Principal
	instanceState func(id string, state string)
}

func setup(t *testing.T) *fixture {
	e := apitest.New(t)
	ctx := context.Background()
	_, admin := e.PlatformAdmin(t)
	f := &fixture{e: e, admin: admin, owner: e.NewTenant(t, admin, "Owner"), x: e.NewTenant(t, admin, "X"), y: e.NewTenant(t, admin, "Y"),
		svc: e.App.SharedRuntimes, ctx: ctx}
	f.workers = &fakeWorkers{e: e}
	f.svc.Workers = f.workers
	f.principalOf = func(tn apitest.Tenant) *principal.Principal {
		return &principal.Principal{UserID: tn.AdminID, TenantID: tn.ID, TenantRole: "admin"}
	}
	f.instanceState = func(id, state string) {
		if _, err := e.Pool.Exec(ctx, `UPDATE app_instances SET state = $2 WHERE id = $1`, id, state); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.App.Billing.CreatePlan(ctx, "Default", true, nil, []billing.PriceInput{{Unit: "gpu.test", Currency: "EUR", UnitPrice: "0.001"}}); err != nil {
		t.Fatal(err)
	}
	want(t, e.Call(t, "POST", "/api/v1/admin/apps", admin, map[string]any{"slug": "llm", "name": "LLM", "kind": "vllm",
		"versions": []any{map[string]any{"version": "1", "command": []string{"serve", "--port", "{{port}}"}, "port": 8000,
			"health_check": map[string]any{"type": "http", "path": "/health"}}}}, ""), 201, "", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/apps/llm/entitlements", admin, map[string]any{"tenant_id": f.owner.ID}, ""), 201, "", "")
	return f
}

func (f *fixture) create(t *testing.T, kind string, allocs int) apitest.Answer {
	t.Helper()
	ids := make([]string, allocs)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	time.Sleep(2 * time.Millisecond) // each plan version must take effect after the one before
	return f.e.Call(t, "POST", "/api/v1/admin/shared-runtimes", f.admin, map[string]any{"name": "Shared LLM", "app_slug": "llm", "version": "1",
		"owner_kind": kind, "owner_project_id": f.owner.DefaultProject, "allocation_ids": ids, "usage_unit": "request",
		"unit_price": map[string]any{"amount_minor": 5, "currency": "EUR"}}, "")
}

func workersOf(t *testing.T, a apitest.Answer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, w := range a.Body["workers"].([]any) {
		out = append(out, w.(map[string]any))
	}
	return out
}

func TestSharedRuntimeAccessAndAuditOnChange(t *testing.T) {
	f := setup(t)
	e := f.e
	persisted := func() int { return e.Count(t, `SELECT count(*) FROM shared_runtimes`) }
	// Only platform admins create; a refusal leaves nothing.
	want(t, e.Call(t, "POST", "/api/v1/admin/shared-runtimes", f.owner.AdminToken, map[string]any{}, ""), 403, "admin_required", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/shared-runtimes", f.admin, map[string]any{"name": "x", "app_slug": "llm", "version": "1",
		"owner_kind": "platform", "owner_project_id": f.owner.DefaultProject, "allocation_ids": []string{}, "usage_unit": "request",
		"unit_price": map[string]any{"amount_minor": 5, "currency": "EUR"}}, ""), 422, "validation_error", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/shared-runtimes", f.admin, map[string]any{"name": "x", "app_slug": "llm", "version": "1",
		"owner_kind": "platform", "owner_project_id": f.x.DefaultProject, "allocation_ids": []string{uuid.NewString()}, "usage_unit": "request",
		"unit_price": map[string]any{"amount_minor": 5, "currency": "EUR"}}, ""), 403, "app_not_entitled", "")
	if persisted() != 0 || e.Count(t, `SELECT count(*) FROM app_instances`) != 0 {
		t.Fatal("a refused create left rows")
	}

	rt := f.create(t, "platform", 2)
	want(t, rt, 201, "", "")
	id := rt.Str("id")
	ws := workersOf(t, rt)
	if len(ws) != 2 || rt.Str("state") != "provisioning" || ws[0]["state"] != "starting" {
		t.Fatalf("created: %s", rt.Raw)
	}
	tenantRT := f.create(t, "tenant", 1)
	want(t, tenantRT, 201, "", "")

	// Visibility: the platform's runtime to everyone, a tenant's to its projects only.
	px, py, po := f.x.DefaultProject.String(), f.y.DefaultProject.String(), f.owner.DefaultProject.String()
	want(t, e.Call(t, "GET", "/api/v1/shared-runtimes/"+id, f.x.AdminToken, nil, px), 200, "", "")
	want(t, e.Call(t, "GET", "/api/v1/shared-runtimes/"+tenantRT.Str("id"), f.x.AdminToken, nil, px), 404, "app_not_found", "")
	want(t, e.Call(t, "GET", "/api/v1/shared-runtimes/"+tenantRT.Str("id"), f.owner.AdminToken, nil, po), 200, "", "")
	if l := e.Call(t, "GET", "/api/v1/shared-runtimes", f.x.AdminToken, nil, px); len(l.Body["items"].([]any)) != 1 {
		t.Fatalf("x lists: %s", l.Raw)
	}

	// Attach X; twice is a conflict; Y sees X's attachment not.
	att := e.Call(t, "POST", "/api/v1/shared-runtimes/"+id+"/attachments", f.x.AdminToken, nil, px)
	want(t, att, 201, "", "")
	want(t, e.Call(t, "POST", "/api/v1/shared-runtimes/"+id+"/attachments", f.x.AdminToken, nil, px), 409, "invalid_request", "already_attached")
	if g := e.Call(t, "GET", "/api/v1/shared-runtimes/"+id, f.x.AdminToken, nil, px); g.Body["attached"] != true {
		t.Fatalf("attached: %s", g.Raw)
	}
	if l := e.Call(t, "GET", "/api/v1/shared-runtimes/"+id+"/attachments", f.y.AdminToken, nil, py); len(l.Body["items"].([]any)) != 0 {
		t.Fatalf("y sees: %s", l.Raw)
	}
	if l := e.Call(t, "GET", "/api/v1/shared-runtimes/"+id+"/attachments", f.owner.AdminToken, nil, po); len(l.Body["items"].([]any)) != 1 {
		t.Fatalf("owner sees: %s", l.Raw)
	}
	want(t, e.Call(t, "DELETE", "/api/v1/shared-runtimes/"+id+"/attachments/"+att.Str("id"), f.y.AdminToken, nil, py), 404, "app_not_found", "attachment_not_found")

	// The proxy's grant: X's members get through to a worker, Y's do not.
	inst := uuid.MustParse(ws[0]["app_instance_id"].(string))
	target := proxy.Target{InstanceID: inst}
	if pid, ok, err := f.svc.ProxyGrant(f.ctx, f.principalOf(f.x), target); err != nil || !ok || pid != f.x.DefaultProject {
		t.Fatalf("x grant: %v %v %v", pid, ok, err)
	}
	if _, ok, err := f.svc.ProxyGrant(f.ctx, f.principalOf(f.y), target); err != nil || ok {
		t.Fatalf("y grant: %v %v", ok, err)
	}

	// Worker reports: audited when the state changes, not when it repeats.
	reports := func() int {
		return e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'shared_runtime.worker.report'`)
	}
	for _, w := range ws {
		f.instanceState(w["app_instance_id"].(string), "running")
	}
	for i := 0; i < 100; i++ {
		if err := f.svc.Sync(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := reports(); n != 2 {
		t.Fatalf("%d report audit rows after 100 identical passes, want 2", n)
	}
	if g := e.Call(t, "GET", "/api/v1/shared-runtimes/"+id, f.x.AdminToken, nil, px); g.Str("state") != "running" {
		t.Fatalf("state: %s", g.Raw)
	}
	f.instanceState(ws[1]["app_instance_id"].(string), "unhealthy")
	for i := 0; i < 10; i++ {
		_ = f.svc.Sync(f.ctx)
	}
	if n := reports(); n != 3 {
		t.Fatalf("%d report audit rows, want 3", n)
	}
	if g := e.Call(t, "GET", "/api/v1/shared-runtimes/"+id, f.x.AdminToken, nil, px); g.Str("state") != "degraded" {
		t.Fatalf("state: %s", g.Raw)
	}

	// Detaching ends the grant.
	want(t, e.Call(t, "DELETE", "/api/v1/shared-runtimes/"+id+"/attachments/"+att.Str("id"), f.x.AdminToken, nil, px), 204, "", "")
	if _, ok, _ := f.svc.ProxyGrant(f.ctx, f.principalOf(f.x), target); ok {
		t.Fatal("grant after detach")
	}
	if err := f.svc.ProxiedCall(f.ctx, proxy.Call{Target: target, UserID: f.x.AdminID, ProjectID: f.x.DefaultProject, CallID: uuid.New(), At: time.Now()}); err == nil {
		t.Fatal("a detached project's call was metered")
	}
}

// Calls of an attached project are rated once per unit into its ledger, whatever the
// concurrency of calls, repeats and rating passes; the owner's own calls are not.
func TestMeteringRatedOncePerUnit(t *testing.T) {
	f := setup(t)
	e := f.e
	rt := f.create(t, "platform", 1)
	want(t, rt, 201, "", "")
	id := rt.Str("id")
	want(t, e.Call(t, "POST", "/api/v1/shared-runtimes/"+id+"/attachments", f.x.AdminToken, nil, f.x.DefaultProject.String()), 201, "", "")
	inst := uuid.MustParse(workersOf(t, rt)[0]["app_instance_id"].(string))
	f.instanceState(inst.String(), "running")
	if err := f.svc.Sync(f.ctx); err != nil {
		t.Fatal(err)
	}
	target := proxy.Target{InstanceID: inst, ProjectID: f.owner.DefaultProject}

	const calls = 60
	callIDs := make([]uuid.UUID, calls)
	for i := range callIDs {
		callIDs[i] = uuid.New()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*calls)
	stop := make(chan struct{})
	var raters sync.WaitGroup
	for r := 0; r < 3; r++ { // rating passes race the calls
		raters.Add(1)
		go func() {
			defer raters.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.svc.RateCalls(f.ctx, 7); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < calls; i++ {
		for rep := 0; rep < 2; rep++ { // every call reported twice
			wg.Add(1)
			go func(id uuid.UUID) {
				defer wg.Done()
				errs <- f.svc.ProxiedCall(f.ctx, proxy.Call{Target: target, UserID: f.x.AdminID, ProjectID: f.x.DefaultProject, CallID: id, At: time.Now()})
			}(callIDs[i])
		}
	}
	// The owner's own calls are not metered.
	for i := 0; i < 5; i++ {
		if err := f.svc.ProxiedCall(f.ctx, proxy.Call{Target: target, UserID: f.owner.AdminID, ProjectID: f.owner.DefaultProject, CallID: uuid.New(), At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(stop)
	raters.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for {
		st, err := f.svc.RateCalls(f.ctx, 1000)
		if err != nil || st.Failed > 0 {
			t.Fatalf("rate: %+v %v", st, err)
		}
		if st.Calls == 0 {
			break
		}
	}
	if n := e.Count(t, `SELECT count(*) FROM shared_runtime_usage`); n != calls {
		t.Fatalf("%d metered calls, want %d", n, calls)
	}
	if n := e.Count(t, `SELECT count(*) FROM shared_runtime_usage WHERE usage_record_id IS NULL`); n != 0 {
		t.Fatalf("%d calls not rated", n)
	}
	var units, amount int64
	var projectOK bool
	err := e.Pool.QueryRow(f.ctx, `SELECT COALESCE(sum(units), 0), COALESCE(sum(amount_minor), 0), bool_and(project_id = $2)
		FROM billing_rated_usage_lines WHERE usage_source = 'app_runtime' AND usage_unit = $1`,
		sharedruntimes.BillingUnit(uuid.MustParse(id)), f.x.DefaultProject).Scan(&units, &amount, &projectOK)
	if err != nil {
		t.Fatal(err)
	}
	if units != calls || amount != calls*5 || !projectOK {
		t.Fatalf("rated %d units for %d minor (x's project only: %v), want %d units for %d", units, amount, projectOK, calls, calls*5)
	}
	// Visible as X's usage through the billing API.
	u := e.Call(t, "GET", "/api/v1/billing/usage", f.x.AdminToken, nil, "")
	want(t, u, 200, "", "")
	found := false
	for _, it := range u.Body["items"].([]any) {
		if it.(map[string]any)["usage_source"] == "app_runtime" {
			found = true
		}
	}
	if !found {
		t.Fatalf("x's usage: %s", u.Raw)
	}
	_ = fmt.Sprint
}

// Worker and repair operations restart or drain workers through their instances.
func TestWorkerAndRepairOperations(t *testing.T) {
	f := setup(t)
	e := f.e
	rt := f.create(t, "platform", 2)
	want(t, rt, 201, "", "")
	id := rt.Str("id")
	ws := workersOf(t, rt)
	w0, w1 := ws[0]["id"].(string), ws[1]["id"].(string)
	for _, w := range ws {
		f.instanceState(w["app_instance_id"].(string), "running")
	}
	_ = f.svc.Sync(f.ctx)
	po, px := f.owner.DefaultProject.String(), f.x.DefaultProject.String()
	base := "/api/v1/shared-runtimes/" + id

	// Only the owner project operates workers.
	want(t, e.Call(t, "POST", base+"/workers/"+w0+"/operations", f.x.AdminToken, map[string]any{"kind": "restart"}, px), 403, "insufficient_permissions", "")
	want(t, e.Call(t, "POST", base+"/workers/"+uuid.NewString()+"/operations", f.owner.AdminToken, map[string]any{"kind": "restart"}, po), 404, "app_not_found", "worker_not_found")
	op := e.Call(t, "POST", base+"/workers/"+w0+"/operations", f.owner.AdminToken, map[string]any{"kind": "restart"}, po)
	want(t, op, 202, "", "")
	want(t, e.Call(t, "POST", base+"/workers/"+w0+"/operations", f.owner.AdminToken, map[string]any{"kind": "drain"}, po), 409, "app_instance_state_invalid", "operation_in_flight")

	getOp := func() apitest.Answer {
		return e.Call(t, "GET", base+"/workers/"+w0+"/operations/"+op.Str("id"), f.owner.AdminToken, nil, po)
	}
	_ = f.svc.Sync(f.ctx) // pending: the old instance is stopped
	if g := getOp(); g.Str("state") != "running" || len(f.workers.stopped) != 1 {
		t.Fatalf("after stop: %s (%d stops)", g.Raw, len(f.workers.stopped))
	}
	_ = f.svc.Sync(f.ctx) // the old one ended: a new instance on the allocation
	worker := func(wid string) map[string]any {
		g := e.Call(t, "GET", base, f.owner.AdminToken, nil, po)
		for _, w := range workersOf(t, g) {
			if w["id"] == wid {
				return w
			}
		}
		t.Fatalf("worker %s gone", wid)
		return nil
	}
	nw := worker(w0)
	if nw["app_instance_id"] == ws[0]["app_instance_id"] || nw["allocation_id"] != ws[0]["allocation_id"] {
		t.Fatalf("restart kept the instance: %v", nw)
	}
	f.instanceState(nw["app_instance_id"].(string), "running")
	_ = f.svc.Sync(f.ctx)
	if g := getOp(); g.Str("state") != "succeeded" || g.Body["finished_at"] == nil {
		t.Fatalf("restart: %s", g.Raw)
	}

	// A failed worker is replaced by a repair.
	f.instanceState(ws[1]["app_instance_id"].(string), "failed")
	_ = f.svc.Sync(f.ctx)
	if worker(w1)["state"] != "failed" {
		t.Fatal("worker not failed")
	}
	rep := e.Call(t, "POST", base+"/repair-operations", f.owner.AdminToken, map[string]any{"kind": "replace_failed_workers"}, po)
	want(t, rep, 202, "", "")
	want(t, e.Call(t, "POST", base+"/repair-operations", f.owner.AdminToken, map[string]any{"kind": "restart_unhealthy_workers"}, po), 409, "app_instance_state_invalid", "")
	for i := 0; i < 3; i++ {
		_ = f.svc.Sync(f.ctx)
	}
	f.instanceState(worker(w1)["app_instance_id"].(string), "running")
	for i := 0; i < 2; i++ {
		_ = f.svc.Sync(f.ctx)
	}
	g := e.Call(t, "GET", base+"/repair-operations/"+rep.Str("id"), f.owner.AdminToken, nil, po)
	if g.Str("state") != "succeeded" || len(g.Body["worker_ids"].([]any)) != 1 || g.Body["worker_ids"].([]any)[0] != w1 {
		t.Fatalf("repair: %s", g.Raw)
	}
	if worker(w1)["state"] != "running" {
		t.Fatal("repaired worker not running")
	}
	if l := e.Call(t, "GET", base+"/workers/"+w1+"/operations", f.owner.AdminToken, nil, po); len(l.Body["items"].([]any)) != 1 {
		t.Fatalf("w1 ops: %s", l.Raw)
	}

	// Drain: the worker takes no more calls and stops.
	d := e.Call(t, "POST", base+"/workers/"+w0+"/operations", f.owner.AdminToken, map[string]any{"kind": "drain"}, po)
	want(t, d, 202, "", "")
	for i := 0; i < 3; i++ {
		_ = f.svc.Sync(f.ctx)
	}
	if worker(w0)["state"] != "stopped" {
		t.Fatalf("drained worker: %v", worker(w0))
	}
	inst := uuid.MustParse(worker(w0)["app_instance_id"].(string))
	if _, ok, _ := f.svc.ProxyGrant(f.ctx, f.principalOf(f.x), proxy.Target{InstanceID: inst}); ok {
		t.Fatal("a drained worker is still granted")
	}
}

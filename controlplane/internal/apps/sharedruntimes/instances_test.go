package sharedruntimes_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/sharedruntimes"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// allocs stands in for allocations (tested on their own): active allocations of a
// project on one node.
type allocs struct {
	m map[uuid.UUID]allocations.Allocation
}

func (a allocs) Get(_ context.Context, projectID, id uuid.UUID) (allocations.Allocation, error) {
	x, ok := a.m[id]
	if !ok || x.ProjectID != projectID {
		return allocations.Allocation{}, apierr.NotFound(apierr.AllocationNotFound, "allocation")
	}
	return x, nil
}

func (allocs) Create(context.Context, *principal.Principal, projectctx.Project, allocations.CreateSpec) (allocations.Allocation, error) {
	return allocations.Allocation{}, apierr.New(apierr.SKUNotFound, "no skus here")
}

func (allocs) Release(context.Context, *principal.Principal, projectctx.Project, uuid.UUID) (allocations.Allocation, error) {
	return allocations.Allocation{}, nil
}

func (allocs) ReleaseAsSystem(context.Context, uuid.UUID, uuid.UUID, string) (allocations.Allocation, error) {
	return allocations.Allocation{}, nil
}

// The workers of a runtime are real app instances of the owner project, launched with
// the instances service's checks in the runtime's transaction: a launch refused on one
// allocation leaves neither runtime nor instance.
func TestWorkersAreAppInstances(t *testing.T) {
	f := setup(t)
	e := f.e
	node := uuid.Must(uuid.NewV7())
	a := allocs{m: map[uuid.UUID]allocations.Allocation{}}
	mk := func(project uuid.UUID, status string, gpus int32) uuid.UUID {
		id := uuid.Must(uuid.NewV7())
		a.m[id] = allocations.Allocation{ID: id, ProjectID: project, TenantID: f.owner.ID, Status: status, GpuCount: gpus, GpuModel: "H100", NodeID: node}
		return id
	}
	ok1, ok2 := mk(f.owner.DefaultProject, "active", 1), mk(f.owner.DefaultProject, "idle", 2)
	inactive, foreign := mk(f.owner.DefaultProject, "releasing", 1), mk(f.x.DefaultProject, "active", 1)
	e.App.Instances.Allocations = a
	f.svc.Workers = sharedruntimes.InstanceWorkers{Svc: e.App.Instances}

	create := func(ids ...uuid.UUID) map[string]any {
		return map[string]any{"name": "Shared", "app_slug": "llm", "version": "1", "owner_kind": "platform",
			"owner_project_id": f.owner.DefaultProject, "allocation_ids": ids, "usage_unit": "request",
			"unit_price": map[string]any{"amount_minor": 1, "currency": "EUR"}}
	}
	want(t, e.Call(t, "POST", "/api/v1/admin/shared-runtimes", f.admin, create(ok1, inactive), ""), 409, "allocation_not_active", "")
	want(t, e.Call(t, "POST", "/api/v1/admin/shared-runtimes", f.admin, create(ok1, foreign), ""), 404, "allocation_not_found", "")
	if n := e.Count(t, `SELECT (SELECT count(*) FROM shared_runtimes) + (SELECT count(*) FROM app_instances)`); n != 0 {
		t.Fatalf("%d rows left by refused creates", n)
	}

	rt := e.Call(t, "POST", "/api/v1/admin/shared-runtimes", f.admin, create(ok1, ok2), "")
	want(t, rt, 201, "", "")
	id := uuid.MustParse(rt.Str("id"))
	if n := e.Count(t, `SELECT count(*) FROM app_instances WHERE shared_runtime_id = $1 AND project_id = $2 AND state = 'requested'`, id, f.owner.DefaultProject); n != 2 {
		t.Fatalf("%d worker instances, want 2", n)
	}
	// The owner project sees them as its app instances, marked as the runtime's.
	l := e.Call(t, "GET", "/api/v1/app-instances", f.owner.AdminToken, nil, f.owner.DefaultProject.String())
	want(t, l, 200, "", "")
	for _, it := range l.Body["items"].([]any) {
		if it.(map[string]any)["shared_runtime_id"] != id.String() {
			t.Fatalf("instance not marked: %v", it)
		}
	}
	// A drain stops the worker's instance through the instances service.
	w := workersOf(t, rt)[0]
	want(t, e.Call(t, "POST", "/api/v1/shared-runtimes/"+id.String()+"/workers/"+w["id"].(string)+"/operations", f.owner.AdminToken,
		map[string]any{"kind": "drain"}, f.owner.DefaultProject.String()), 202, "", "")
	if err := f.svc.Sync(f.ctx); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := e.Pool.QueryRow(f.ctx, `SELECT state FROM app_instances WHERE id = $1`, w["app_instance_id"]).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "stopping" && state != "stopped" {
		t.Fatalf("drained worker's instance is %s", state)
	}
}

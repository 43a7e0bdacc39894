package allocations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/proto/api"
)

func TestCreateReadRelease(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	big := w.node(t, "big", 8)
	small := w.node(t, "small", 2)
	proj := w.Acme.DefaultProject

	a := w.mustCreate(t, "train-1")
	if a.Status != "requested" || a.Sku != sku1x || a.GpuCount != 1 || a.RegionCode != region || len(a.SSHKeyIds) != 1 {
		t.Fatalf("created: %+v", a)
	}
	// Pack: the node with the fewest free GPUs that fits.
	if a.NodeID != small {
		t.Fatalf("placed on %s, want the smaller node %s (pack)", a.NodeID, small)
	}
	// 0.001 USD per GPU-second = 3.60 USD an hour.
	if a.HourlyRate == nil || *a.HourlyRate != (api.Money{AmountMinor: 360, Currency: "USD"}) || a.AccruedCost != nil {
		t.Fatalf("rate: %+v %+v", a.HourlyRate, a.AccruedCost)
	}
	if got := w.writes(t); got != [6]int{1, 1, 1, 1, 1, 1} {
		t.Fatalf("writes after create: %v", got)
	}
	// The fleet and the catalog see the held GPU.
	if used, err := w.App.Nodes.Allocations.NodeInUse(ctx, small); err != nil || !used {
		t.Fatalf("node in use: %v %v", used, err)
	}
	if used, err := w.App.Nodes.Allocations.NodeInUse(ctx, big); err != nil || used {
		t.Fatalf("big node in use: %v %v", used, err)
	}
	if r, _ := w.Root.DeleteSkuWithResponse(ctx, sku1x, &api.DeleteSkuParams{}); r.StatusCode() != 409 {
		t.Fatalf("delete sku in use: %d %s", r.StatusCode(), r.Body)
	}
	o, _ := w.Alice.GetCatalogSkuWithResponse(ctx, sku1x, &api.GetCatalogSkuParams{})
	if o.StatusCode() != 200 || o.JSON200.Availability[0].FreeGpus != 9 {
		t.Fatalf("catalog availability: %s", o.Body)
	}

	g, _ := w.Alice.GetAllocationWithResponse(ctx, a.ID, &api.GetAllocationParams{XProjectID: proj})
	if g.StatusCode() != 200 || g.JSON200.ID != a.ID {
		t.Fatalf("get: %d %s", g.StatusCode(), g.Body)
	}
	b := w.mustCreate(t, "train-2")
	c := w.mustCreate(t, "train-3")
	if b.NodeID != small || c.NodeID != big {
		t.Fatalf("placement: b on %s, c on %s", b.NodeID, c.NodeID)
	}
	l, _ := w.Alice.ListAllocationsWithResponse(ctx, &api.ListAllocationsParams{XProjectID: proj, PageSize: ptr(2)})
	if l.StatusCode() != 200 || len(l.JSON200.Items) != 2 || l.JSON200.Pagination.NextCursor == nil {
		t.Fatalf("list page 1: %s", l.Body)
	}
	l2, _ := w.Alice.ListAllocationsWithResponse(ctx, &api.ListAllocationsParams{XProjectID: proj, PageSize: ptr(2), Cursor: l.JSON200.Pagination.NextCursor})
	if l2.StatusCode() != 200 || len(l2.JSON200.Items) != 1 || l2.JSON200.Pagination.NextCursor != nil || l2.JSON200.Items[0].ID != c.ID {
		t.Fatalf("list page 2: %s", l2.Body)
	}

	rel, _ := w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: proj})
	if rel.StatusCode() != 200 || rel.JSON200.Status != "releasing" {
		t.Fatalf("release: %d %s", rel.StatusCode(), rel.Body)
	}
	rel, _ = w.Alice.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: proj})
	wantError(t, rel.Body, rel.StatusCode(), 409, "allocation_already_releasing", "release_in_progress")
	// Releasing keeps the GPUs until the node acknowledges.
	if n := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, a.ID); n != 1 {
		t.Fatalf("held gpus while releasing: %d", n)
	}
	ev, _ := w.Alice.ListAllocationEventsWithResponse(ctx, a.ID, &api.ListAllocationEventsParams{XProjectID: proj})
	if ev.StatusCode() != 200 || len(ev.JSON200.Items) != 2 {
		t.Fatalf("events: %s", ev.Body)
	}
	e0, e1 := ev.JSON200.Items[0], ev.JSON200.Items[1]
	if e0.FromStatus != nil || e0.ToStatus != "requested" || e0.Event != "create" || e0.ActorType != "user" || e0.CorrelationID == nil ||
		e1.FromStatus == nil || *e1.FromStatus != "requested" || e1.ToStatus != "releasing" || e1.Event != "release" {
		t.Fatalf("events: %s", ev.Body)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'allocation.release' AND target_id = $1`, a.ID.String()); n != 1 {
		t.Fatalf("release audit rows: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'allocation.releasing'`); n != 1 {
		t.Fatalf("release outbox events: %d", n)
	}
}

// Every pre-check refuses with its exact code and writes nothing, in the documented order.
func TestPreChecksPersistNothing(t *testing.T) {
	w := newWorld(t, 2)
	ctx := context.Background()
	w.node(t, "n1", 4)
	w.sku(t, "h100-80gb-sxm.8x", 8)
	proj := w.Acme.DefaultProject

	// A viewer, and a member without SSH keys, of acme's default project.
	viewerID, viewerTok := w.NewUser(t, w.Acme.AdminToken, "member")
	memberID, memberTok := w.NewUser(t, w.Acme.AdminToken, "member")
	for id, role := range map[uuid.UUID]api.ProjectRole{viewerID: api.ProjectRoleViewer, memberID: api.ProjectRoleMember} {
		r, err := w.Alice.AddProjectMemberWithResponse(ctx, proj, &api.AddProjectMemberParams{}, api.AddProjectMemberRequest{UserID: id, Role: role})
		if err != nil || r.StatusCode() != 201 {
			t.Fatalf("add member: %v %s", err, r.Body)
		}
	}
	viewer, member := w.Client(viewerTok), w.Client(memberTok)
	w.addKey(t, viewer) // the viewer has a key: the refusal must be about the role

	// A tenant without credit, and one whose budget blocks launches.
	broke := w.NewTenant(t, w.rootToken(t), "Broke")
	brokeC := w.Client(broke.AdminToken)
	w.addKey(t, brokeC)
	budgeted := w.NewTenant(t, w.rootToken(t), "Budgeted")
	budgetedC := w.Client(budgeted.AdminToken)
	w.addKey(t, budgetedC)
	w.credit(t, budgeted.ID, 1_000_000)
	mode := api.BillingBudgetEnforcementModeBlockLaunch
	if r, err := budgetedC.CreateBillingBudgetWithResponse(ctx, &api.CreateBillingBudgetParams{}, api.BillingBudgetCreateRequest{
		Name: ptr("cap"), Amount: api.Money{AmountMinor: 100, Currency: "USD"}, Period: api.BillingBudgetCreateRequestPeriodMonthly,
		ScopeType: api.BillingBudgetScopeTypeTenant, EnforcementMode: &mode,
	}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("budget: %v %s", err, r.Body)
	}

	body := api.CreateAllocationJSONRequestBody{Name: "job", Sku: sku1x}
	cases := []struct {
		name    string
		c       *api.ClientWithResponses
		project uuid.UUID
		body    api.CreateAllocationJSONRequestBody
		status  int
		code    string
		reason  string
	}{
		{"unknown sku", w.Alice, proj, api.CreateAllocationJSONRequestBody{Name: "job", Sku: "a100-40gb.1x"}, 404, "sku_not_found", ""},
		{"viewer", viewer, proj, body, 403, "insufficient_permissions", ""},
		{"region not offered", w.Alice, proj, api.CreateAllocationJSONRequestBody{Name: "job", Sku: sku1x, RegionCode: ptr("us-east-1")}, 422, "validation_error", "region_not_offered"},
		{"unknown os image", w.Alice, proj, api.CreateAllocationJSONRequestBody{Name: "job", Sku: sku1x, OsImageID: ptr(uuid.New())}, 422, "validation_error", "os_image_not_found"},
		{"no ssh key", member, proj, body, 422, "validation_error", "no_ssh_key"},
		{"unknown ssh key", w.Alice, proj, api.CreateAllocationJSONRequestBody{Name: "job", Sku: sku1x, SSHKeyIds: []uuid.UUID{uuid.New()}}, 422, "validation_error", "ssh_key_not_found"},
		{"budget blocks", budgetedC, budgeted.DefaultProject, body, 409, "invalid_request", "budget_exceeded"},
		{"no balance", brokeC, broke.DefaultProject, body, 402, "insufficient_balance", ""},
		{"no capacity", w.Alice, proj, api.CreateAllocationJSONRequestBody{Name: "job", Sku: "h100-80gb-sxm.8x"}, 409, "sku_unavailable", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := w.writes(t)
			r, err := w.create(tc.c, tc.project, "", tc.body)
			if err != nil {
				t.Fatal(err)
			}
			wantError(t, r.Body, r.StatusCode(), tc.status, tc.code, tc.reason)
			if after := w.writes(t); after != before {
				t.Fatalf("writes changed: %v -> %v", before, after)
			}
		})
	}

	// The concurrency limit (2 per project): two launches fill it, the third is refused.
	w.mustCreate(t, "one")
	w.mustCreate(t, "two")
	before := w.writes(t)
	r, _ := w.create(w.Alice, proj, "", body)
	wantError(t, r.Body, r.StatusCode(), 429, "allocation_concurrency_limit", "")
	if after := w.writes(t); after != before {
		t.Fatalf("writes changed: %v -> %v", before, after)
	}
}

func (w *world) rootToken(t *testing.T) string {
	t.Helper()
	_, tok := w.PlatformAdmin(t)
	return tok
}

// 96 concurrent launches against the 8 GPUs of one node, from 12 tenants with 4
// projects each (two launches per project): exactly 8 win, every other is
// sku_unavailable, and no GPU is held twice.
//
// The launches come from many projects on purpose: launches of one project queue on the
// project's advisory lock (lockLaunch), so they never race; launches of different
// projects take the GPU model's lock shared and race for the same GPUs, and only the
// reservation (ClaimGPUs on allocation_gpus_held_key) and placeSingle's check that the
// claim got every GPU keep a GPU from being given twice. With that check broken (a claim
// that lost treated as won) this test fails: allocations are created without GPUs.
func TestConcurrentCreatesNeverDoubleBook(t *testing.T) {
	w := newWorld(t, 1000)
	ctx := context.Background()
	node := w.node(t, "a", 8)
	const tenants, projectsPerTenant, perProject = 12, 4, 2
	type launcher struct {
		c       *api.ClientWithResponses
		project uuid.UUID
	}
	var launchers []launcher
	root := w.rootToken(t)
	for i := range tenants {
		tn, c := w.Acme, w.Alice
		if i > 0 {
			tn = w.NewTenant(t, root, fmt.Sprintf("Tenant %d", i))
			c = w.Client(tn.AdminToken)
			w.addKey(t, c)
			w.credit(t, tn.ID, 1_000_000)
		}
		launchers = append(launchers, launcher{c, tn.DefaultProject})
		for j := 1; j < projectsPerTenant; j++ {
			r, err := c.CreateProjectWithResponse(ctx, &api.CreateProjectParams{}, api.CreateProjectRequest{Name: fmt.Sprintf("p%d", j)})
			if err != nil || r.StatusCode() != 201 {
				t.Fatalf("project: %v %s", err, r.Body)
			}
			launchers = append(launchers, launcher{c, r.JSON201.Project.ID})
		}
	}
	n := len(launchers) * perProject
	var wg sync.WaitGroup
	codes := make([]int, n)
	bodies := make([][]byte, n)
	start := make(chan struct{})
	for i := range n {
		l := launchers[i%len(launchers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := w.create(l.c, l.project, "", api.CreateAllocationJSONRequestBody{Name: fmt.Sprintf("job-%d", i), Sku: sku1x})
			if err != nil {
				t.Error(err)
				return
			}
			codes[i], bodies[i] = r.StatusCode(), r.Body
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	for i := range n {
		switch codes[i] {
		case 201:
			created++
		default:
			wantError(t, bodies[i], codes[i], 409, "sku_unavailable", "")
		}
	}
	if created != 8 {
		t.Fatalf("created %d allocations, want 8", created)
	}
	if got := w.count(t, `SELECT count(*) FROM allocations`); got != 8 {
		t.Fatalf("allocation rows: %d", got)
	}
	// Every allocation holds exactly one GPU of the node, and no GPU is held twice.
	if got := w.count(t, `SELECT count(*) FROM allocations a
		WHERE a.node_id <> $1 OR (SELECT count(*) FROM allocation_gpus g WHERE g.allocation_id = a.id AND g.released_at IS NULL) <> 1`, node); got != 0 {
		t.Fatalf("%d allocations without exactly one held GPU of the node", got)
	}
	if held, distinct := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE released_at IS NULL`),
		w.count(t, `SELECT count(DISTINCT (node_id, gpu_uuid)) FROM allocation_gpus WHERE released_at IS NULL`); held != 8 || distinct != 8 {
		t.Fatalf("held %d GPUs, %d distinct", held, distinct)
	}
	if got := w.writes(t); got != [6]int{8, 8, 8, 8, 8, 8} {
		t.Fatalf("writes: %v", got)
	}
}

// 50 concurrent launches with one Idempotency-Key make one allocation.
func TestConcurrentCreatesWithOneIdempotencyKey(t *testing.T) {
	w := newWorld(t, 1000)
	w.node(t, "a", 8)
	const n = 50
	var wg sync.WaitGroup
	ids := make(chan uuid.UUID, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := w.create(w.Alice, w.Acme.DefaultProject, "launch-1", api.CreateAllocationJSONRequestBody{Name: "job", Sku: sku1x})
			if err != nil {
				t.Error(err)
				return
			}
			switch r.StatusCode() {
			case 201:
				ids <- r.JSON201.ID
			case 409: // the first request is still running
				wantError(t, r.Body, r.StatusCode(), 409, "invalid_request", "idempotency_key_in_progress")
			default:
				t.Errorf("unexpected %d %s", r.StatusCode(), r.Body)
			}
		}()
	}
	wg.Wait()
	close(ids)
	var first uuid.UUID
	for id := range ids {
		if first == uuid.Nil {
			first = id
		}
		if id != first {
			t.Fatalf("two allocations answered: %s, %s", first, id)
		}
	}
	if first == uuid.Nil {
		t.Fatal("no request succeeded")
	}
	// A retry after the race replays the first answer.
	r, _ := w.create(w.Alice, w.Acme.DefaultProject, "launch-1", api.CreateAllocationJSONRequestBody{Name: "job", Sku: sku1x})
	if r.StatusCode() != 201 || r.JSON201.ID != first {
		t.Fatalf("replay: %d %s", r.StatusCode(), r.Body)
	}
	if got := w.writes(t); got != [6]int{1, 1, 1, 1, 1, 1} {
		t.Fatalf("writes: %v", got)
	}
}

// Another tenant cannot see or touch an allocation: 404 allocation_not_found with its
// own project, 403 for a project that is not its own.
func TestCrossTenantIsNotFound(t *testing.T) {
	w := newWorld(t, 16)
	ctx := context.Background()
	w.node(t, "a", 2)
	a := w.mustCreate(t, "mine")
	other := w.NewTenant(t, w.rootToken(t), "Other")
	oc := w.Client(other.AdminToken)
	op := other.DefaultProject

	g, _ := oc.GetAllocationWithResponse(ctx, a.ID, &api.GetAllocationParams{XProjectID: op})
	wantError(t, g.Body, g.StatusCode(), 404, "allocation_not_found", "")
	ev, _ := oc.ListAllocationEventsWithResponse(ctx, a.ID, &api.ListAllocationEventsParams{XProjectID: op})
	wantError(t, ev.Body, ev.StatusCode(), 404, "allocation_not_found", "")
	rel, _ := oc.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: op})
	wantError(t, rel.Body, rel.StatusCode(), 404, "allocation_not_found", "")
	l, _ := oc.ListAllocationsWithResponse(ctx, &api.ListAllocationsParams{XProjectID: op})
	if l.StatusCode() != 200 || len(l.JSON200.Items) != 0 {
		t.Fatalf("other's list: %s", l.Body)
	}
	g, _ = oc.GetAllocationWithResponse(ctx, a.ID, &api.GetAllocationParams{XProjectID: w.Acme.DefaultProject})
	wantError(t, g.Body, g.StatusCode(), 403, "insufficient_permissions", "")
	rel, _ = oc.ReleaseAllocationWithResponse(ctx, a.ID, &api.ReleaseAllocationParams{XProjectID: w.Acme.DefaultProject})
	wantError(t, rel.Body, rel.StatusCode(), 403, "insufficient_permissions", "")

	g, _ = w.Alice.GetAllocationWithResponse(ctx, a.ID, &api.GetAllocationParams{XProjectID: w.Acme.DefaultProject})
	if g.StatusCode() != 200 || g.JSON200.Status != "requested" {
		t.Fatalf("owner's view after the attempts: %s", g.Body)
	}
}

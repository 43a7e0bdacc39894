package allocations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (w *world) createGroup(c *api.ClientWithResponses, project uuid.UUID, key string, body api.CreateAllocationGroupJSONRequestBody) *api.CreateAllocationGroupHTTPResponse {
	p := &api.CreateAllocationGroupParams{XProjectID: project}
	if key != "" {
		p.IdempotencyKey = &key
	}
	r, err := c.CreateAllocationGroupWithResponse(context.Background(), p, body)
	if err != nil {
		panic(err)
	}
	return r
}

// groupWrites is writes plus the group rows and the group's outbox events and audit rows.
func (w *world) groupWrites(t *testing.T) [9]int {
	t.Helper()
	c := w.writes(t)
	return [9]int{c[0], c[1], c[2], c[3], c[4], c[5],
		w.count(t, `SELECT count(*) FROM allocation_groups`),
		w.count(t, `SELECT count(*) FROM outbox_events WHERE event_type LIKE 'allocation\_group.%'`),
		w.count(t, `SELECT count(*) FROM audit_events WHERE action LIKE 'allocation\_group.%'`),
	}
}

// A group is placed whole or not at all, across nodes, with the single launch's checks
// counting every member; it is read with its members and released together.
func TestAllocationGroups(t *testing.T) {
	w := newWorld(t, 5)
	ctx := context.Background()
	a := w.node(t, "a", 2)
	b := w.node(t, "b", 2)
	proj := w.Acme.DefaultProject

	r := w.createGroup(w.Alice, proj, "", api.CreateAllocationGroupJSONRequestBody{Name: "gang", Sku: sku1x, Count: 3})
	if r.StatusCode() != 201 {
		t.Fatalf("create group: %d %s", r.StatusCode(), r.Body)
	}
	g := *r.JSON201
	if g.Count != 3 || len(g.Members) != 3 || len(g.AllocationIds) != 3 || g.LiveCount != 3 || g.RegionCode != region || g.Sku != sku1x {
		t.Fatalf("group: %s", r.Body)
	}
	// Pack across nodes: the first two members fill one node, the third goes to the other.
	onNode := map[uuid.UUID]int{}
	for i, m := range g.Members {
		if m.Status != "requested" || m.AllocationGroupID == nil || *m.AllocationGroupID != g.ID || m.Name != fmt.Sprintf("gang-%d", i+1) {
			t.Fatalf("member %d: %+v", i, m)
		}
		onNode[m.NodeID]++
	}
	if len(onNode) != 2 || onNode[a]+onNode[b] != 3 || g.Members[0].NodeID != g.Members[1].NodeID {
		t.Fatalf("placement: %v", onNode)
	}
	if got := w.groupWrites(t); got != [9]int{3, 3, 3, 3, 3, 3, 1, 1, 1} {
		t.Fatalf("writes after the group: %v", got)
	}
	// A single allocation names no group.
	single := w.mustCreate(t, "single")
	if single.AllocationGroupID != nil {
		t.Fatalf("single launch has a group: %+v", single)
	}

	// No GPU is left now: a group of 1 does not fit (capacity, nothing persisted).
	before := w.groupWrites(t)
	r = w.createGroup(w.Alice, proj, "", api.CreateAllocationGroupJSONRequestBody{Name: "more", Sku: sku1x, Count: 1})
	wantError(t, r.Body, r.StatusCode(), 409, "sku_unavailable", "")
	// The concurrency limit counts every member (4 live + 2 > 5) and comes before capacity.
	r = w.createGroup(w.Alice, proj, "", api.CreateAllocationGroupJSONRequestBody{Name: "more", Sku: sku1x, Count: 2})
	wantError(t, r.Body, r.StatusCode(), 429, "allocation_concurrency_limit", "")
	// Bounds of count and name (the contract's limits, then the service's).
	for _, n := range []int{0, allocations.MaxGroupMembers + 1} {
		r = w.createGroup(w.Alice, proj, "", api.CreateAllocationGroupJSONRequestBody{Name: "x", Sku: sku1x, Count: n})
		wantError(t, r.Body, r.StatusCode(), 422, "validation_error", "")
	}
	r = w.createGroup(w.Alice, proj, "", api.CreateAllocationGroupJSONRequestBody{Name: "  ", Sku: sku1x, Count: 1})
	wantError(t, r.Body, r.StatusCode(), 422, "validation_error", "length")
	r = w.createGroup(w.Alice, proj, "", api.CreateAllocationGroupJSONRequestBody{Name: "x", Sku: "a100-40gb.1x", Count: 1})
	wantError(t, r.Body, r.StatusCode(), 404, "sku_not_found", "")
	if after := w.groupWrites(t); after != before {
		t.Fatalf("refused groups wrote: %v -> %v", before, after)
	}

	// Read: the group with its members; the list with member ids, paginated.
	gr, _ := w.Alice.GetAllocationGroupWithResponse(ctx, g.ID, &api.GetAllocationGroupParams{XProjectID: proj})
	if gr.StatusCode() != 200 || len(gr.JSON200.Members) != 3 || gr.JSON200.Members[2].ID != g.Members[2].ID {
		t.Fatalf("get group: %d %s", gr.StatusCode(), gr.Body)
	}
	l, _ := w.Alice.ListAllocationGroupsWithResponse(ctx, &api.ListAllocationGroupsParams{XProjectID: proj, PageSize: ptr(1)})
	if l.StatusCode() != 200 || len(l.JSON200.Items) != 1 || l.JSON200.Items[0].ID != g.ID || len(l.JSON200.Items[0].AllocationIds) != 3 ||
		l.JSON200.Pagination.NextCursor != nil {
		t.Fatalf("list groups: %s", l.Body)
	}

	// Another tenant sees nothing; a viewer may read but not release.
	other := w.NewTenant(t, w.rootToken(t), "Other")
	oc := w.Client(other.AdminToken)
	og, _ := oc.GetAllocationGroupWithResponse(ctx, g.ID, &api.GetAllocationGroupParams{XProjectID: other.DefaultProject})
	wantError(t, og.Body, og.StatusCode(), 404, "allocation_not_found", "")
	orl, _ := oc.ReleaseAllocationGroupWithResponse(ctx, g.ID, &api.ReleaseAllocationGroupParams{XProjectID: other.DefaultProject})
	wantError(t, orl.Body, orl.StatusCode(), 404, "allocation_not_found", "")
	ol, _ := oc.ListAllocationGroupsWithResponse(ctx, &api.ListAllocationGroupsParams{XProjectID: other.DefaultProject})
	if ol.StatusCode() != 200 || len(ol.JSON200.Items) != 0 {
		t.Fatalf("other's list: %s", ol.Body)
	}
	viewerID, viewerTok := w.NewUser(t, w.Acme.AdminToken, "member")
	if m, err := w.Alice.AddProjectMemberWithResponse(ctx, proj, &api.AddProjectMemberParams{}, api.AddProjectMemberRequest{UserID: viewerID, Role: api.ProjectRoleViewer}); err != nil || m.StatusCode() != 201 {
		t.Fatalf("add viewer: %v %s", err, m.Body)
	}
	vr, _ := w.Client(viewerTok).ReleaseAllocationGroupWithResponse(ctx, g.ID, &api.ReleaseAllocationGroupParams{XProjectID: proj})
	wantError(t, vr.Body, vr.StatusCode(), 403, "insufficient_permissions", "")
	ur, _ := w.Alice.ReleaseAllocationGroupWithResponse(ctx, uuid.New(), &api.ReleaseAllocationGroupParams{XProjectID: proj})
	wantError(t, ur.Body, ur.StatusCode(), 404, "allocation_not_found", "")

	// One member is already gone (admin force-release); the group's release moves the
	// other two together, in one transaction, and is audited once for the group.
	if fr, _ := w.Root.ForceReleaseAllocationWithResponse(ctx, g.Members[0].ID, &api.ForceReleaseAllocationParams{}); fr.StatusCode() != 200 {
		t.Fatalf("force-release: %s", fr.Body)
	}
	rel, _ := w.Alice.ReleaseAllocationGroupWithResponse(ctx, g.ID, &api.ReleaseAllocationGroupParams{XProjectID: proj})
	if rel.StatusCode() != 200 {
		t.Fatalf("release group: %d %s", rel.StatusCode(), rel.Body)
	}
	want := []api.V3WorkloadStatus{"released", "releasing", "releasing"}
	for i, m := range rel.JSON200.Members {
		if m.Status != want[i] {
			t.Fatalf("member %d after the group release: %s", i, m.Status)
		}
	}
	if rel.JSON200.LiveCount != 2 {
		t.Fatalf("live count: %d", rel.JSON200.LiveCount)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'allocation_group.release' AND target_id = $1`, g.ID.String()); n != 1 {
		t.Fatalf("group release audit rows: %d", n)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_tasks WHERE kind = 'allocation.release' AND allocation_id = ANY($1)`,
		[]uuid.UUID{g.Members[1].ID, g.Members[2].ID}); n != 2 {
		t.Fatalf("release tasks: %d", n)
	}
	// Nothing is left to release.
	before = w.groupWrites(t)
	rel, _ = w.Alice.ReleaseAllocationGroupWithResponse(ctx, g.ID, &api.ReleaseAllocationGroupParams{XProjectID: proj})
	wantError(t, rel.Body, rel.StatusCode(), 409, "allocation_already_releasing", "")
	if after := w.groupWrites(t); after != before {
		t.Fatalf("a refused group release wrote: %v -> %v", before, after)
	}
}

// The money checks count every member: the runway must cover count x the SKU's GPUs.
func TestAllocationGroupRunwayCountsEveryMember(t *testing.T) {
	w := newWorld(t, 16)
	w.node(t, "a", 8)
	// 3.60 USD an hour per GPU and a minimum runway of 1h: 10 USD cover two members, not three.
	poor := w.NewTenant(t, w.rootToken(t), "Poor")
	pc := w.Client(poor.AdminToken)
	w.addKey(t, pc)
	w.credit(t, poor.ID, 1000)
	before := w.groupWrites(t)
	r := w.createGroup(pc, poor.DefaultProject, "", api.CreateAllocationGroupJSONRequestBody{Name: "gang", Sku: sku1x, Count: 3})
	wantError(t, r.Body, r.StatusCode(), 402, "insufficient_balance", "")
	if after := w.groupWrites(t); after != before {
		t.Fatalf("a refused group wrote: %v -> %v", before, after)
	}
	r = w.createGroup(pc, poor.DefaultProject, "", api.CreateAllocationGroupJSONRequestBody{Name: "gang", Sku: sku1x, Count: 2})
	if r.StatusCode() != 201 || len(r.JSON201.Members) != 2 {
		t.Fatalf("group of 2: %d %s", r.StatusCode(), r.Body)
	}
}

// Concurrent group launches against 4 free GPUs (two nodes of 2): groups of 3 one-GPU
// members can only fit once; every other launch is sku_unavailable and leaves nothing
// behind — never a partial group, never a GPU held twice.
func TestAllocationGroupsAllOrNothingUnderContention(t *testing.T) {
	w := newWorld(t, 1000)
	w.node(t, "a", 2)
	w.node(t, "b", 2)
	const n = 12
	var wg sync.WaitGroup
	codes := make([]int, n)
	bodies := make([][]byte, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := w.createGroup(w.Alice, w.Acme.DefaultProject, "", api.CreateAllocationGroupJSONRequestBody{Name: fmt.Sprintf("g%d", i), Sku: sku1x, Count: 3})
			codes[i], bodies[i] = r.StatusCode(), r.Body
		}()
	}
	wg.Wait()
	created := 0
	for i := range n {
		if codes[i] == 201 {
			created++
			continue
		}
		wantError(t, bodies[i], codes[i], 409, "sku_unavailable", "")
	}
	if created != 1 {
		t.Fatalf("created %d groups, want 1", created)
	}
	if got := w.groupWrites(t); got != [9]int{3, 3, 3, 3, 3, 3, 1, 1, 1} {
		t.Fatalf("writes: %v", got)
	}
	if held, distinct := w.count(t, `SELECT count(*) FROM allocation_gpus WHERE released_at IS NULL`),
		w.count(t, `SELECT count(DISTINCT (node_id, gpu_uuid)) FROM allocation_gpus WHERE released_at IS NULL`); held != 3 || distinct != 3 {
		t.Fatalf("held %d GPUs, %d distinct", held, distinct)
	}
	// The last GPU still serves a single launch.
	w.mustCreate(t, "last")
}

// One Idempotency-Key makes one group.
func TestAllocationGroupIdempotency(t *testing.T) {
	w := newWorld(t, 1000)
	w.node(t, "a", 8)
	body := api.CreateAllocationGroupJSONRequestBody{Name: "gang", Sku: sku1x, Count: 2}
	first := w.createGroup(w.Alice, w.Acme.DefaultProject, "gang-1", body)
	if first.StatusCode() != 201 {
		t.Fatalf("create: %s", first.Body)
	}
	again := w.createGroup(w.Alice, w.Acme.DefaultProject, "gang-1", body)
	if again.StatusCode() != 201 || again.JSON201.ID != first.JSON201.ID {
		t.Fatalf("replay: %d %s", again.StatusCode(), again.Body)
	}
	if n := w.count(t, `SELECT count(*) FROM allocation_groups`); n != 1 {
		t.Fatalf("groups: %d", n)
	}
}

// TestAllocationGroupStorageAttachments: a group create may name storage_attachments, as
// a single create does. They are checked and authorised once before anything is written
// (no such bucket, another tenant's, a traversing mount path, two at one mount path:
// the attachment API's errors, no group, member or attachment stored); an accepted
// group gives every member its own attachments, waiting (attaching, no task yet) for
// the member to become active, each audited, and a replay with the same
// Idempotency-Key adds none.
func TestAllocationGroupStorageAttachments(t *testing.T) {
	w := newWorld(t, 1000)
	w.node(t, "a", 8)
	proj := w.Acme.DefaultProject
	for _, b := range []string{"data", "out"} {
		if a := w.Call(t, "POST", "/api/v1/storage/buckets", w.Acme.AdminToken, map[string]any{"bucket_id": b}, proj.String()); a.Status != 201 {
			t.Fatalf("create bucket %s: %d %s", b, a.Status, a.Raw)
		}
	}
	_, root := w.PlatformAdmin(t)
	other := w.NewTenant(t, root, "Other")
	if a := w.Call(t, "POST", "/api/v1/storage/buckets", other.AdminToken, map[string]any{"bucket_id": "data"}, other.DefaultProject.String()); a.Status != 201 {
		t.Fatalf("create the other tenant's bucket: %d %s", a.Status, a.Raw)
	}
	attachments := func() int { return w.count(t, `SELECT count(*) FROM storage_attachments`) }
	sa := func(bucket string, mode api.StorageAttachmentMode, mount string, owner *uuid.UUID) api.CreateStorageAttachmentRequest {
		r := api.CreateStorageAttachmentRequest{BucketID: bucket, Mode: mode, BucketProjectID: owner}
		if mount != "" {
			r.MountPath = &mount
		}
		return r
	}
	before := w.groupWrites(t)
	refused := []struct {
		name   string
		list   []api.CreateStorageAttachmentRequest
		status int
		code   string
	}{
		{"no such bucket", []api.CreateStorageAttachmentRequest{sa("data", "ro", "", nil), sa("nope", "ro", "", nil)}, 404, "storage_object_not_found"},
		{"another tenant's bucket", []api.CreateStorageAttachmentRequest{sa("data", "ro", "", &other.DefaultProject)}, 404, "storage_object_not_found"},
		{"traversing mount path", []api.CreateStorageAttachmentRequest{sa("data", "ro", "../x", nil)}, 400, "storage_path_traversal"},
		{"two at one mount path", []api.CreateStorageAttachmentRequest{sa("data", "ro", "", nil), sa("data", "rw", "", nil)}, 409, "storage_already_exists"},
	}
	for _, c := range refused {
		r := w.createGroup(w.Alice, proj, "", api.CreateAllocationGroupJSONRequestBody{Name: "gang", Sku: sku1x, Count: 2, StorageAttachments: c.list})
		if r.StatusCode() != c.status {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.StatusCode(), r.Body, c.status, c.code)
			continue
		}
		wantError(t, r.Body, r.StatusCode(), c.status, c.code, "")
	}
	if after := w.groupWrites(t); after != before {
		t.Fatalf("refused groups wrote: %v -> %v", before, after)
	}
	if n := attachments(); n != 0 {
		t.Fatalf("refused groups stored %d attachments", n)
	}

	body := api.CreateAllocationGroupJSONRequestBody{Name: "gang", Sku: sku1x, Count: 3, StorageAttachments: []api.CreateStorageAttachmentRequest{
		sa("data", "ro", "", nil), sa("out", "rw", "results", nil)}}
	r := w.createGroup(w.Alice, proj, "gang-key", body)
	if r.StatusCode() != 201 || len(r.JSON201.Members) != 3 {
		t.Fatalf("create group with storage_attachments: %d %s", r.StatusCode(), r.Body)
	}
	for _, m := range r.JSON201.Members {
		got := w.count(t, `SELECT count(*) FROM storage_attachments WHERE allocation_id = $1 AND state = 'attaching' AND task_id IS NULL
			AND ((bucket_id = 'data' AND mode = 'ro') OR (bucket_id = 'out' AND mode = 'rw' AND mount_path = 'results'))`, m.ID)
		if got != 2 {
			t.Fatalf("member %s has %d of its 2 waiting attachments", m.Name, got)
		}
	}
	if n := attachments(); n != 6 {
		t.Fatalf("%d attachments for 3 members of 2, want 6", n)
	}
	if n := w.count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage_attachment.create'`); n != 6 {
		t.Fatalf("%d storage_attachment.create audit rows, want 6", n)
	}
	again := w.createGroup(w.Alice, proj, "gang-key", body)
	if again.StatusCode() != 201 || again.JSON201.ID != r.JSON201.ID || attachments() != 6 {
		t.Fatalf("replay: %d %s, %d attachments", again.StatusCode(), again.Body, attachments())
	}
}

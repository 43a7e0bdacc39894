package e2e_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/proto/api"
)

// TestStorageAttachmentsOnLaunch: an allocation create may name storage_attachments.
// Refusals first, each leaving no allocation and no attachment: a bucket that does not
// exist, another tenant's bucket, and a bucket the caller holds only a read grant on
// asked for rw (insufficient_permissions, the attachment API's answer too, which stores
// nothing either). Then a launch with one ro attachment (repeated with its
// Idempotency-Key: one allocation, one attachment) gets the bucket mounted once the
// allocation is active, read from a shell inside the allocation.
func TestStorageAttachmentsOnLaunch(t *testing.T) {
	w := newStorageWorld(t, "copy", "")
	ctx := context.Background()
	env := w.c.env
	const hello = "dataset from the launch"
	if code, body := w.object(t, http.MethodPut, "hello.txt", hello+"\n"); code != 201 && code != 200 {
		t.Fatalf("put hello.txt: %d %s", code, body)
	}

	// u: a member of the allocation's project (it may launch and attach there) holding
	// only a read grant on bucket "shared" of another project of the tenant.
	uID, uTok := env.NewUser(t, w.token, "member")
	if a := env.Call(t, "POST", "/api/v1/projects/"+w.project.String()+"/members", w.token, map[string]any{"user_id": uID, "role": "member"}, ""); a.Status != 201 {
		t.Fatalf("add member: %d %s", a.Status, a.Raw)
	}
	a := env.Call(t, "POST", "/api/v1/projects", w.token, map[string]any{"name": "Datasets"}, "")
	if a.Status != 201 {
		t.Fatalf("create project: %d %s", a.Status, a.Raw)
	}
	datasets := a.Body["project"].(map[string]any)["id"].(string)
	if a := env.Call(t, "POST", "/api/v1/storage/buckets", w.token, map[string]any{"bucket_id": "shared"}, datasets); a.Status != 201 {
		t.Fatalf("create shared: %d %s", a.Status, a.Raw)
	}
	if a := env.Call(t, "POST", "/api/v1/storage/buckets/shared/grants", w.token, map[string]any{"grantee_kind": "user", "grantee_id": uID, "access": "read"}, datasets); a.Status != 201 {
		t.Fatalf("read grant: %d %s", a.Status, a.Raw)
	}
	// u has a key, so a launch of u's is refused for its attachments alone.
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	if r, err := env.Client(uTok).CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "u", PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	// Another tenant's bucket.
	other := env.NewTenant(t, w.c.admin, "Other storage")
	if a := env.Call(t, "POST", "/api/v1/storage/buckets", other.AdminToken, map[string]any{"bucket_id": "theirs"}, other.DefaultProject.String()); a.Status != 201 {
		t.Fatalf("create theirs: %d %s", a.Status, a.Raw)
	}

	allocations := func() int {
		return env.Count(t, `SELECT count(*) FROM allocations WHERE tenant_id = $1`, w.tenant.ID)
	}
	attachments := func() int { return env.Count(t, `SELECT count(*) FROM storage_attachments`) }
	allocsBefore, attachBefore := allocations(), attachments()
	launch := func(tok string, sa map[string]any) (int, string) {
		a := env.Call(t, "POST", "/api/v1/allocations", tok, map[string]any{"name": "refused", "sku": e2eSKU, "storage_attachments": []any{sa}}, w.project.String())
		return a.Status, a.Code() + " " + string(a.Raw)
	}
	refused := []struct {
		name   string
		token  string
		body   map[string]any
		status int
		code   string
	}{
		{"no such bucket", w.token, map[string]any{"bucket_id": "nope", "mode": "ro"}, 404, "storage_object_not_found"},
		{"another tenant's bucket", w.token, map[string]any{"bucket_id": "theirs", "mode": "ro", "bucket_project_id": other.DefaultProject}, 404, "storage_object_not_found"},
		{"read grant asking rw", uTok, map[string]any{"bucket_id": "shared", "mode": "rw", "bucket_project_id": datasets}, 403, "insufficient_permissions"},
		{"no access to the owner project's bucket", uTok, map[string]any{"bucket_id": "shared", "mode": "ro"}, 404, "storage_object_not_found"},
		{"traversal", w.token, map[string]any{"bucket_id": "data", "mode": "ro", "mount_path": "../x"}, 400, "storage_path_traversal"},
	}
	for _, c := range refused {
		if status, got := launch(c.token, c.body); status != c.status || !strings.HasPrefix(got, c.code+" ") {
			t.Errorf("launch with %s: %d %s, want %d %s", c.name, status, got, c.status, c.code)
		}
		// The attachment API gives the same answer for the same entry.
		if r := env.Call(t, http.MethodPost, "/api/v1/allocations/"+w.alloc.String()+"/storage-attachments", c.token, c.body, w.project.String()); r.Status != c.status || r.Code() != c.code {
			t.Errorf("attach %s: %d %s, want %d %s", c.name, r.Status, r.Raw, c.status, c.code)
		}
	}
	// Two entries at one mount path.
	if a := env.Call(t, "POST", "/api/v1/allocations", w.token, map[string]any{"name": "twice", "sku": e2eSKU, "storage_attachments": []any{
		map[string]any{"bucket_id": "data", "mode": "ro"}, map[string]any{"bucket_id": "data", "mode": "rw"},
	}}, w.project.String()); a.Status != 409 || a.Code() != "storage_already_exists" {
		t.Errorf("two attachments at one path: %d %s", a.Status, a.Raw)
	}
	if n := allocations(); n != allocsBefore {
		t.Fatalf("refused launches created allocations: %d -> %d", allocsBefore, n)
	}
	if n := attachments(); n != attachBefore {
		t.Fatalf("refused launches or attachments stored attachments: %d -> %d", attachBefore, n)
	}
	// The read grant does allow ro (so the 403 above is about the mode alone).
	if r := env.Call(t, http.MethodPost, "/api/v1/allocations/"+w.alloc.String()+"/storage-attachments", uTok,
		map[string]any{"bucket_id": "shared", "mode": "ro", "bucket_project_id": datasets}, w.project.String()); r.Status != 202 {
		t.Fatalf("ro with a read grant: %d %s", r.Status, r.Raw)
	}

	// Room on the node for the launch: release the world's allocation.
	if rr, err := w.alice.ReleaseAllocationWithResponse(ctx, w.alloc, &api.ReleaseAllocationParams{XProjectID: w.project}); err != nil || rr.StatusCode() != 200 {
		t.Fatalf("release: %v %s", err, rr.Body)
	}
	eventually(t, "allocation released", func() bool { return w.allocationStatus(t) == "released" })

	key := uuid.NewString()
	body := api.CreateAllocationJSONRequestBody{Name: "with-data", Sku: e2eSKU,
		StorageAttachments: []api.CreateStorageAttachmentRequest{{BucketID: "data", Mode: "ro"}}}
	var first uuid.UUID
	for i := range 2 {
		cr, err := w.alice.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: w.project, IdempotencyKey: &key}, body)
		if err != nil || cr.StatusCode() != 201 {
			t.Fatalf("create allocation with storage_attachments (try %d): %v %s", i, err, cr.Body)
		}
		if i == 0 {
			first = cr.JSON201.ID
		} else if cr.JSON201.ID != first {
			t.Fatalf("the repeated create made another allocation: %s, %s", first, cr.JSON201.ID)
		}
	}
	w.alloc = first
	list := w.attachments(t)
	if len(list) != 1 {
		t.Fatalf("%d attachments after the launch and its repeat, want 1", len(list))
	}
	var att api.StorageAttachment
	for _, a := range list {
		att = a
	}
	if att.BucketID != "data" || att.Mode != "ro" || (att.State != "attaching" && att.State != "attached") {
		t.Fatalf("the launch's attachment: %+v", att)
	}
	eventually(t, "allocation active", func() bool { return w.allocationStatus(t) == "active" })
	w.waitState(t, att.AttachmentID, "attached")
	out, code := w.shell(t, `cat "$HOME/buckets/data/hello.txt"`)
	if code != 0 || !strings.Contains(out, hello) {
		t.Fatalf("reading the launch's attachment from the shell: exit %d, output %q", code, out)
	}
	if n := env.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage_attachment.allocation_active' AND target_id = $1`, att.AttachmentID.String()); n != 1 {
		t.Fatalf("%d allocation_active audit rows, want 1", n)
	}
}

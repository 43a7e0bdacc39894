package storage_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
)

// TestGrants: a bucket is shared with a project, a user or a service account of the same
// tenant; the grantee reads (or writes) it through the owner project's X-Project-ID, a
// revoke stops that at the next request, other tenants and strangers are told the
// bucket does not exist, and grants to unknown or foreign targets are refused with
// nothing stored.
func TestGrants(t *testing.T) {
	e := apitest.New(t)
	_, root := e.PlatformAdmin(t)
	acme := e.NewTenant(t, root, "Acme")
	other := e.NewTenant(t, root, "Other")
	uID, uTok := e.NewUser(t, acme.AdminToken, "member")
	otherUser, _ := e.NewUser(t, other.AdminToken, "member")
	owner := acme.DefaultProject.String()
	admin := acme.AdminToken

	// u owns a project of its own (Q) but has no role in the owner project.
	a := e.Call(t, "POST", "/api/v1/projects", uTok, map[string]any{"name": "Team Q"}, "")
	if a.Status != 201 {
		t.Fatalf("create project: %d %s", a.Status, a.Raw)
	}
	q := a.Body["project"].(map[string]any)["id"].(string)
	if a := e.Call(t, "POST", buckets, admin, map[string]any{"bucket_id": "shared"}, owner); a.Status != 201 {
		t.Fatalf("create bucket: %d %s", a.Status, a.Raw)
	}
	objectPath := bucketPath("shared") + "/object?path=a.txt"

	// No grant: the bucket does not exist for u, for reads and writes alike.
	for _, m := range []string{"GET", "DELETE"} {
		if a := e.Call(t, m, map[string]string{"GET": bucketPath("shared"), "DELETE": objectPath}[m], uTok, nil, owner); a.Status != 404 || a.Code() != "storage_object_not_found" {
			t.Fatalf("%s without a grant: %d %s", m, a.Status, a.Raw)
		}
	}
	// Only the owner project's admins grant.
	if a := e.Call(t, "POST", bucketPath("shared")+"/grants", uTok, map[string]any{"grantee_kind": "user", "grantee_id": uID, "access": "read"}, owner); a.Status != 403 {
		t.Fatalf("grant by a stranger: %d %s", a.Status, a.Raw)
	}

	before := e.Count(t, `SELECT count(*) FROM storage_grants`)
	refused := []struct {
		kind, id, why string
	}{
		{"user", uuid.NewString(), "unknown user"},
		{"project", uuid.NewString(), "unknown project"},
		{"service_account", uuid.NewString(), "unknown service account"},
		{"user", otherUser.String(), "another tenant's user"},
		{"project", other.DefaultProject.String(), "another tenant's project"},
		{"project", owner, "the owner project itself"},
	}
	for _, r := range refused {
		a := e.Call(t, "POST", bucketPath("shared")+"/grants", admin, map[string]any{"grantee_kind": r.kind, "grantee_id": r.id, "access": "read"}, owner)
		d, _ := a.Body["details"].(map[string]any)
		if a.Status != 422 || a.Code() != "validation_error" || d["field"] != "grantee_id" {
			t.Errorf("grant to %s: %d %s", r.why, a.Status, a.Raw)
		}
	}
	if a := e.Call(t, "POST", bucketPath("shared")+"/grants", admin, map[string]any{"grantee_kind": "group", "grantee_id": uID, "access": "read"}, owner); a.Status != 422 {
		t.Errorf("grant to a group: %d %s", a.Status, a.Raw)
	}
	if after := e.Count(t, `SELECT count(*) FROM storage_grants`); after != before {
		t.Fatalf("refused grants were stored: %d -> %d", before, after)
	}

	// A read grant to project Q reaches u through its membership there.
	a = e.Call(t, "POST", bucketPath("shared")+"/grants", admin, map[string]any{"grantee_kind": "project", "grantee_id": q, "access": "read"}, owner)
	if a.Status != 201 || a.Str("grantee_kind") != "project" || a.Str("access") != "read" || a.Str("bucket_id") != "shared" {
		t.Fatalf("grant to project: %d %s", a.Status, a.Raw)
	}
	projectGrant := a.Str("grant_id")
	if a := e.Call(t, "POST", bucketPath("shared")+"/grants", admin, map[string]any{"grantee_kind": "project", "grantee_id": q, "access": "read_write"}, owner); a.Status != 409 || a.Code() != "storage_already_exists" {
		t.Fatalf("second grant to the same project: %d %s", a.Status, a.Raw)
	}
	a = e.Call(t, "GET", bucketPath("shared"), uTok, nil, owner)
	if a.Status != 200 || a.Str("access") != "read" || a.Body["grants"] != nil {
		t.Fatalf("grantee get: %d %s", a.Status, a.Raw)
	}
	// Read cannot write: refused before the body is read.
	if a := e.Call(t, "DELETE", objectPath, uTok, nil, owner); a.Status != 403 || a.Code() != "insufficient_permissions" {
		t.Fatalf("read grantee deleting: %d %s", a.Status, a.Raw)
	}

	// A read_write grant to u itself, and one to a service account of the tenant.
	a = e.Call(t, "POST", bucketPath("shared")+"/grants", admin, map[string]any{"grantee_kind": "user", "grantee_id": uID, "access": "read_write"}, owner)
	if a.Status != 201 {
		t.Fatalf("grant to user: %d %s", a.Status, a.Raw)
	}
	userGrant := a.Str("grant_id")
	if a := e.Call(t, "GET", bucketPath("shared"), uTok, nil, owner); a.Status != 200 || a.Str("access") != "read_write" {
		t.Fatalf("read_write grantee get: %d %s", a.Status, a.Raw)
	}
	sa := e.Call(t, "POST", "/api/v1/service-accounts", admin, map[string]any{"name": "trainer"}, "")
	if sa.Status != 201 {
		t.Fatalf("service account: %d %s", sa.Status, sa.Raw)
	}
	saID, _ := sa.Body["id"].(string)
	if saID == "" {
		saID, _ = sa.Body["service_account"].(map[string]any)["id"].(string)
	}
	if a := e.Call(t, "POST", bucketPath("shared")+"/grants", admin, map[string]any{"grantee_kind": "service_account", "grantee_id": saID, "access": "read"}, owner); a.Status != 201 {
		t.Fatalf("grant to service account: %d %s", a.Status, a.Raw)
	}

	// The service account reads the bucket with its own token (client credentials).
	c := e.Call(t, "POST", "/api/v1/service-accounts/"+saID+"/credentials", admin, map[string]any{"name": "trainer key"}, "")
	if c.Status != 201 {
		t.Fatalf("credential: %d %s", c.Status, c.Raw)
	}
	form := url.Values{"grant_type": {"client_credentials"}, "client_id": {c.Str("client_id")}, "client_secret": {c.Str("client_secret")}}
	req, err := http.NewRequest("POST", e.Server.URL+"/api/v1/auth/token", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	tk := e.Send(t, req)
	saTok := tk.Str("access_token")
	if tk.Status != 200 || saTok == "" {
		t.Fatalf("service account token: %d %s", tk.Status, tk.Raw)
	}
	if a := e.Call(t, "GET", bucketPath("shared"), saTok, nil, owner); a.Status != 200 || a.Str("access") != "read" {
		t.Fatalf("service account get: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "DELETE", objectPath, saTok, nil, owner); a.Status != 403 || a.Code() != "insufficient_permissions" {
		t.Fatalf("read-only service account deleting: %d %s", a.Status, a.Raw)
	}

	// The owner project sees the grants, on the bucket and paged.
	if a := e.Call(t, "GET", bucketPath("shared"), admin, nil, owner); a.Status != 200 || len(a.Body["grants"].([]any)) != 3 {
		t.Fatalf("owner get: %d %s", a.Status, a.Raw)
	}
	seen := 0
	cursor := ""
	for range 5 {
		path := bucketPath("shared") + "/grants?page_size=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		a := e.Call(t, "GET", path, admin, nil, owner)
		if a.Status != 200 {
			t.Fatalf("list grants: %d %s", a.Status, a.Raw)
		}
		seen += len(a.Body["items"].([]any))
		next, _ := a.Body["pagination"].(map[string]any)["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = next
	}
	if seen != 3 {
		t.Fatalf("listed %d grants, want 3", seen)
	}

	// Another tenant never sees the bucket.
	if a := e.Call(t, "GET", bucketPath("shared"), other.AdminToken, nil, owner); a.Status != 404 || a.Code() != "storage_object_not_found" {
		t.Fatalf("other tenant: %d %s", a.Status, a.Raw)
	}

	// Revokes take effect at the next request.
	if a := e.Call(t, "DELETE", bucketPath("shared")+"/grants/"+userGrant, admin, nil, owner); a.Status != 204 {
		t.Fatalf("revoke user grant: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "GET", bucketPath("shared"), uTok, nil, owner); a.Status != 200 || a.Str("access") != "read" {
		t.Fatalf("after revoking the user grant: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "DELETE", bucketPath("shared")+"/grants/"+projectGrant, admin, nil, owner); a.Status != 204 {
		t.Fatalf("revoke project grant: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "GET", bucketPath("shared"), uTok, nil, owner); a.Status != 404 {
		t.Fatalf("after revoking every grant: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "DELETE", bucketPath("shared")+"/grants/"+projectGrant, admin, nil, owner); a.Status != 404 {
		t.Fatalf("revoke twice: %d %s", a.Status, a.Raw)
	}
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage.grant.create'`); n != 3 {
		t.Fatalf("%d grant audit rows, want 3", n)
	}
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage.grant.revoke'`); n != 2 {
		t.Fatalf("%d revoke audit rows, want 2", n)
	}
}

// TestQuota: a project's quota shows usage and the platform default until an admin sets
// the tenant's own; only platform admins set it; an unchanged PUT writes no audit row.
func TestQuota(t *testing.T) {
	e := apitest.New(t, apitest.WithConfig(func(c *app.Config) {
		c.Storage.DefaultQuotaBytes, c.Storage.DefaultQuotaObjects = 1<<30, 1000
	}))
	_, root := e.PlatformAdmin(t)
	ten := e.NewTenant(t, root, "Quota")
	proj := ten.DefaultProject.String()

	a := e.Call(t, "GET", "/api/v1/storage/quota", ten.AdminToken, nil, proj)
	if a.Status != 200 || a.Str("source") != "platform" || a.Body["max_bytes"] != float64(1<<30) || a.Body["max_objects"] != 1000.0 ||
		a.Body["used_bytes"] != 0.0 || a.Str("project_id") != proj {
		t.Fatalf("default quota: %d %s", a.Status, a.Raw)
	}
	path := "/api/v1/admin/tenants/" + ten.ID.String() + "/storage-quota"
	if a := e.Call(t, "GET", path, root, nil, ""); a.Status != 200 || a.Str("source") != "platform" || a.Body["updated_at"] != nil {
		t.Fatalf("tenant default before: %d %s", a.Status, a.Raw)
	}
	body := map[string]any{"max_bytes": 5 << 30, "max_objects": 42}
	if a := e.Call(t, "PUT", path, ten.AdminToken, body, ""); a.Status != 403 || a.Code() != "admin_required" {
		t.Fatalf("tenant admin setting the quota: %d %s", a.Status, a.Raw)
	}
	for range 2 { // the second PUT changes nothing
		if a := e.Call(t, "PUT", path, root, body, ""); a.Status != 200 || a.Str("source") != "tenant" || a.Body["max_objects"] != 42.0 {
			t.Fatalf("set quota: %d %s", a.Status, a.Raw)
		}
	}
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage.quota.update' AND target_id = $1`, ten.ID.String()); n != 1 {
		t.Fatalf("%d quota audit rows, want 1", n)
	}
	if n := e.Count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'storage.quota.updated'`); n != 1 {
		t.Fatalf("%d quota events, want 1", n)
	}
	a = e.Call(t, "GET", "/api/v1/storage/quota", ten.AdminToken, nil, proj)
	if a.Status != 200 || a.Str("source") != "tenant" || a.Body["max_bytes"] != float64(5<<30) || a.Body["max_objects"] != 42.0 {
		t.Fatalf("quota after: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "PUT", "/api/v1/admin/tenants/"+uuid.NewString()+"/storage-quota", root, body, ""); a.Status != 404 {
		t.Fatalf("unknown tenant: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "PUT", path, root, map[string]any{"max_bytes": -1, "max_objects": 1}, ""); a.Status != 422 || a.Code() != "validation_error" {
		t.Fatalf("negative quota: %d %s", a.Status, a.Raw)
	}
}

// TestViewerWithGrant: a viewer of the owner project writes only with a read_write
// grant of its own; the grant lifts the viewer's role for this bucket alone.
func TestViewerWithGrant(t *testing.T) {
	e := apitest.New(t)
	_, root := e.PlatformAdmin(t)
	ten := e.NewTenant(t, root, "Viewer")
	vID, vTok := e.NewUser(t, ten.AdminToken, "member")
	owner := ten.DefaultProject.String()
	if a := e.Call(t, "POST", "/api/v1/projects/"+owner+"/members", ten.AdminToken, map[string]any{"user_id": vID, "role": "viewer"}, ""); a.Status != 201 {
		t.Fatalf("add viewer: %d %s", a.Status, a.Raw)
	}
	for _, b := range []string{"granted", "plain"} {
		if a := e.Call(t, "POST", buckets, ten.AdminToken, map[string]any{"bucket_id": b}, owner); a.Status != 201 {
			t.Fatalf("create %s: %d %s", b, a.Status, a.Raw)
		}
	}
	del := func(bucket string) apitest.Answer {
		return e.Call(t, "DELETE", bucketPath(bucket)+"/object?path=missing.txt", vTok, nil, owner)
	}
	if a := del("granted"); a.Status != 403 || a.Code() != "insufficient_permissions" {
		t.Fatalf("viewer deleting without a grant: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "POST", bucketPath("granted")+"/grants", ten.AdminToken, map[string]any{"grantee_kind": "user", "grantee_id": vID, "access": "read_write"}, owner); a.Status != 201 {
		t.Fatalf("grant: %d %s", a.Status, a.Raw)
	}
	// Past authorization now: the object is simply not there.
	if a := del("granted"); a.Status != 404 || a.Code() != "storage_object_not_found" || a.Body["details"].(map[string]any)["resource"] != "object" {
		t.Fatalf("viewer with a read_write grant deleting: %d %s", a.Status, a.Raw)
	}
	if a := del("plain"); a.Status != 403 || a.Code() != "insufficient_permissions" {
		t.Fatalf("viewer deleting in another bucket: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "GET", bucketPath("granted"), vTok, nil, owner); a.Status != 200 || a.Str("access") != "read_write" || a.Body["grants"] == nil {
		t.Fatalf("viewer get: %d %s", a.Status, a.Raw)
	}
}

// TestRoleChangeTakesEffectAtOnce: object operations take the caller's role in the owner
// project from the request's own project check (no second lookup, no cache), so a
// demotion, a removal and a re-admission each apply from the next request: a member
// writes, a viewer only reads, a removed member is told the bucket does not exist, and
// one re-added as a member writes again.
func TestRoleChangeTakesEffectAtOnce(t *testing.T) {
	e := apitest.New(t)
	_, root := e.PlatformAdmin(t)
	ten := e.NewTenant(t, root, "Roles")
	uID, uTok := e.NewUser(t, ten.AdminToken, "member")
	owner := ten.DefaultProject.String()
	members := "/api/v1/projects/" + owner + "/members"
	if a := e.Call(t, "POST", members, ten.AdminToken, map[string]any{"user_id": uID, "role": "member"}, ""); a.Status != 201 {
		t.Fatalf("add member: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "POST", buckets, ten.AdminToken, map[string]any{"bucket_id": "team"}, owner); a.Status != 201 {
		t.Fatalf("create bucket: %d %s", a.Status, a.Raw)
	}
	put := func(name string) apitest.Answer {
		req := e.Request("PUT", bucketPath("team")+"/object?path="+name, uTok, "")
		req.Body = http.NoBody
		req.Header.Set("X-Project-ID", owner)
		return e.Send(t, req)
	}
	list := func() apitest.Answer { return e.Call(t, "GET", bucketPath("team")+"/objects", uTok, nil, owner) }
	if a := put("one.txt"); a.Status != 200 {
		t.Fatalf("member put: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "PATCH", members+"/"+uID.String(), ten.AdminToken, map[string]any{"role": "viewer"}, ""); a.Status != 200 {
		t.Fatalf("demote: %d %s", a.Status, a.Raw)
	}
	if a := put("two.txt"); a.Status != 403 || a.Code() != "insufficient_permissions" {
		t.Fatalf("viewer put right after the demotion: %d %s", a.Status, a.Raw)
	}
	if a := list(); a.Status != 200 || len(a.Body["objects"].([]any)) != 1 {
		t.Fatalf("viewer list: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "DELETE", members+"/"+uID.String(), ten.AdminToken, nil, ""); a.Status != 204 {
		t.Fatalf("remove: %d %s", a.Status, a.Raw)
	}
	if a := list(); a.Status != 404 || a.Code() != "storage_object_not_found" {
		t.Fatalf("list right after the removal: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "POST", members, ten.AdminToken, map[string]any{"user_id": uID, "role": "member"}, ""); a.Status != 201 {
		t.Fatalf("re-add: %d %s", a.Status, a.Raw)
	}
	if a := put("three.txt"); a.Status != 200 {
		t.Fatalf("member put after re-admission: %d %s", a.Status, a.Raw)
	}
	if n := e.Count(t, `SELECT count(*) FROM storage_objects`); n != 2 {
		t.Fatalf("%d objects stored, want 2", n)
	}
}

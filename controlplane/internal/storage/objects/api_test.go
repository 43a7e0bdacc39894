package objects_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
)

func TestObjectRoundTrip(t *testing.T) {
	w := newWorld(t)
	const body = "hello, object storage\n"
	a := w.put(t, "docs/readme.txt", body, map[string]string{"Content-Type": "text/plain; charset=utf-8"})
	if a.Status != 200 || a.Str("etag") != etagOf(body) || a.Header.Get("ETag") != etagOf(body) ||
		a.Str("path") != "docs/readme.txt" || a.Body["size_bytes"] != float64(len(body)) {
		t.Fatalf("put: %d %s %v", a.Status, a.Raw, a.Header)
	}
	status, h, got := w.get(t, http.MethodGet, "docs/readme.txt", nil)
	if status != 200 || got != body || h.Get("ETag") != etagOf(body) || h.Get("Content-Type") != "text/plain; charset=utf-8" ||
		h.Get("Content-Length") != fmt.Sprint(len(body)) || h.Get("Last-Modified") == "" || h.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("get: %d %v %q", status, h, got)
	}
	// A path spelled another way names the same object ("./docs//readme.txt").
	if status, _, got := w.get(t, http.MethodGet, "./docs//readme.txt", nil); status != 200 || got != body {
		t.Fatalf("get by another spelling: %d %q", status, got)
	}
	status, h, got = w.get(t, http.MethodHead, "docs/readme.txt", nil)
	if status != 200 || got != "" || h.Get("Content-Length") != fmt.Sprint(len(body)) || h.Get("ETag") != etagOf(body) ||
		h.Get("Content-Type") != "text/plain; charset=utf-8" || h.Get("Last-Modified") == "" {
		t.Fatalf("head: %d %v %q", status, h, got)
	}
	// Without a Content-Type the object is application/octet-stream.
	w.put(t, "raw.bin", "\x00\x01", nil)
	if _, h, _ := w.get(t, http.MethodGet, "raw.bin", nil); h.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("default type %q", h.Get("Content-Type"))
	}
	// Replace: the old blob goes, usage follows the new size.
	if a := w.put(t, "docs/readme.txt", "v2", nil); a.Status != 200 || a.Str("etag") != etagOf("v2") {
		t.Fatalf("replace: %s", a.Raw)
	}
	u := w.usage(t, w.project)
	u.exact(t)
	if u.usedBytes != 4 || u.usedObjects != 2 {
		t.Fatalf("usage %+v, want 4 bytes in 2 objects", u)
	}
	if n := len(files(t, w.root)); n != 2 {
		t.Fatalf("%d blobs for 2 objects: %v", n, files(t, w.root))
	}
	if n := w.env.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage.object.put'`); n != 3 {
		t.Fatalf("%d put audit rows, want 3", n)
	}
	// Delete frees the quota and the bytes.
	if a := w.env.Send(t, w.req(t, http.MethodDelete, w.bucket, pathQuery("docs/readme.txt"), nil, nil)); a.Status != 204 {
		t.Fatalf("delete: %d %s", a.Status, a.Raw)
	}
	wantErr(t, w.env.Send(t, w.req(t, http.MethodDelete, w.bucket, pathQuery("docs/readme.txt"), nil, nil)), 404, "storage_object_not_found", "")
	status, _, _ = w.get(t, http.MethodGet, "docs/readme.txt", nil)
	if status != 404 {
		t.Fatalf("get after delete: %d", status)
	}
	u = w.usage(t, w.project)
	u.exact(t)
	if u.usedBytes != 2 || u.usedObjects != 1 || len(files(t, w.root)) != 1 {
		t.Fatalf("after delete: %+v, files %v", u, files(t, w.root))
	}
	if n := w.env.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage.object.delete'`); n != 1 {
		t.Fatalf("%d delete audit rows", n)
	}
	// Unknown bucket, and a bucket of another tenant named with our project: 404.
	wantErr(t, w.env.Send(t, w.req(t, http.MethodGet, "nope", pathQuery("x"), nil, nil)), 404, "storage_object_not_found", "")
	if w.env.Validated.Load() == 0 {
		t.Fatal("no response was validated against the contract")
	}
}

func TestRangesAndConditions(t *testing.T) {
	w := newWorld(t)
	body := strings.Repeat("0123456789", 10) // 100 bytes
	w.put(t, "r", body, nil)
	tag := etagOf(body)
	for _, c := range []struct {
		rng, want, contentRange string
	}{
		{"bytes=0-9", body[:10], "bytes 0-9/100"},
		{"bytes=40-59", body[40:60], "bytes 40-59/100"},
		{"bytes=-7", body[93:], "bytes 93-99/100"},
		{"bytes=95-", body[95:], "bytes 95-99/100"},
		{"bytes=90-1000", body[90:], "bytes 90-99/100"},
	} {
		status, h, got := w.get(t, http.MethodGet, "r", map[string]string{"Range": c.rng})
		if status != 206 || got != c.want || h.Get("Content-Range") != c.contentRange || h.Get("Content-Length") != fmt.Sprint(len(c.want)) {
			t.Fatalf("%s: %d %q %v", c.rng, status, got, h)
		}
	}
	a := w.env.Send(t, w.req(t, http.MethodGet, w.bucket, pathQuery("r"), nil, map[string]string{"Range": "bytes=100-"}))
	wantErr(t, a, 416, "invalid_request", "range_not_satisfiable")
	if a.Header.Get("Content-Range") != "bytes */100" {
		t.Fatalf("416 Content-Range %q", a.Header.Get("Content-Range"))
	}
	// If-Range with a stale tag: the whole object.
	if status, _, got := w.get(t, http.MethodGet, "r", map[string]string{"Range": "bytes=0-0", "If-Range": `"stale"`}); status != 200 || got != body {
		t.Fatalf("stale If-Range: %d", status)
	}
	// Conditional reads.
	if status, h, got := w.get(t, http.MethodGet, "r", map[string]string{"If-None-Match": tag}); status != 304 || got != "" || h.Get("ETag") != tag {
		t.Fatalf("304: %d %v %q", status, h, got)
	}
	if status, _, _ := w.get(t, http.MethodGet, "r", map[string]string{"If-None-Match": `"other"`}); status != 200 {
		t.Fatalf("If-None-Match other: %d", status)
	}
	wantErr(t, w.env.Send(t, w.req(t, http.MethodGet, w.bucket, pathQuery("r"), nil, map[string]string{"If-Match": `"other"`})), 412, "invalid_request", "precondition_failed")
	// Create-only twice: the second finds the object.
	star := map[string]string{"If-None-Match": "*"}
	if a := w.put(t, "once", "first", star); a.Status != 200 {
		t.Fatalf("create-only: %s", a.Raw)
	}
	wantErr(t, w.put(t, "once", "second", star), 409, "storage_already_exists", "")
	// If-Match on PUT: the right tag replaces, a wrong one is 412 and changes nothing.
	wantErr(t, w.put(t, "once", "third", map[string]string{"If-Match": `"nope"`}), 412, "invalid_request", "precondition_failed")
	if a := w.put(t, "once", "fourth", map[string]string{"If-Match": etagOf("first")}); a.Status != 200 {
		t.Fatalf("If-Match put: %s", a.Raw)
	}
	if _, _, got := w.get(t, http.MethodGet, "once", nil); got != "fourth" {
		t.Fatalf("content %q", got)
	}
	wantErr(t, w.env.Send(t, w.req(t, http.MethodDelete, w.bucket, pathQuery("once"), nil, map[string]string{"If-Match": `"nope"`})), 412, "invalid_request", "precondition_failed")
	u := w.usage(t, w.project)
	u.exact(t)
	if len(files(t, w.root)) != 2 {
		t.Fatalf("files %v", files(t, w.root))
	}
}

// The traversal table: every spelling is refused before anything is stored, and no
// file appears anywhere around the driver's root.
func TestTraversalTable(t *testing.T) {
	w := newWorld(t)
	w.put(t, "inside", "x", nil) // the root exists and holds one blob
	parent := filepath.Dir(w.root)
	before := files(t, parent)
	for _, raw := range []string{
		"path=..", "path=../x", "path=../../etc/passwd", "path=a/../../x", "path=a/b/../../../x",
		"path=/etc/passwd", "path=//x", "path=%2Fetc%2Fpasswd",
		"path=%2e%2e/x", "path=%2E%2E%2Fx", "path=.%2e/x", "path=%2e./x",
		"path=%252e%252e/x", "path=%25252e%25252e%25252fx", "path=..%252fx", "path=%252E%252E%255Cx",
		"path=..%5Cx", "path=..%5C..%5Cwindows", "path=a%5C..%5C..%5Cx", "path=..%2F..%5Cx", "path=%5Cx",
		"path=x%00y", "path=%00", "path=a/%0a/b", "path=C:%5Cx", "path=%EF%BC%8E%EF%BC%8E/x",
		"path=%C0%AE%C0%AE/x", "path=%C0%AFx", "path=..%3B/../../x", "path=a/..%2f..%2fx",
	} {
		a := w.env.Send(t, w.req(t, http.MethodPut, w.bucket, raw, strings.NewReader("evil"), nil))
		if a.Status != 400 || a.Code() != "storage_path_traversal" {
			t.Errorf("%s: %d %s", raw, a.Status, a.Raw)
		}
		g := w.env.Send(t, w.req(t, http.MethodGet, w.bucket, raw, nil, nil))
		if g.Status != 400 || g.Code() != "storage_path_traversal" {
			t.Errorf("GET %s: %d %s", raw, g.Status, g.Raw)
		}
	}
	if after := files(t, parent); !slices.Equal(before, after) {
		t.Fatalf("files changed around the root:\nbefore %v\nafter  %v", before, after)
	}
	if n := w.env.Count(t, `SELECT count(*) FROM storage_objects`); n != 1 {
		t.Fatalf("%d objects", n)
	}
	w.usage(t, w.project).exact(t)
	// A listing prefix follows the same rule.
	l := w.env.Call(t, http.MethodGet, "/api/v1/storage/buckets/"+w.bucket+"/objects?prefix="+url.QueryEscape("../"), w.token, nil, w.project)
	wantErr(t, l, 400, "storage_path_traversal", "")
	// Over 1024 bytes is a validation error, not a traversal.
	wantErr(t, w.put(t, strings.Repeat("a", 1025), "x", nil), 422, "validation_error", "")
	if a := w.put(t, strings.Repeat("a", 1024), "x", nil); a.Status != 200 {
		t.Fatalf("1024-byte path: %s", a.Raw)
	}
}

func TestListing(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	// 300 objects: 3 folders of 90 and 30 at the top, written as rows with one shared
	// blob-less size (the listing is a metadata read; these objects are never opened).
	var want []string
	for i := range 300 {
		var p string
		switch {
		case i < 270:
			p = fmt.Sprintf("run%d/step-%03d.ckpt", i/90, i)
		default:
			p = fmt.Sprintf("top-%03d", i)
		}
		want = append(want, p)
	}
	slices.Sort(want)
	for _, p := range want {
		if _, err := w.env.Pool.Exec(ctx, `INSERT INTO storage_objects (bucket, path, project_id, blob_key, size_bytes, etag, content_type, created_at, updated_at)
			SELECT id, $2, project_id, $3, 1, '"x"', 'application/octet-stream', now(), now() FROM storage_buckets WHERE bucket_id = $1`,
			w.bucket, p, "k/"+uuid.NewString()); err != nil {
			t.Fatal(err)
		}
	}
	page := func(q string) apitest.Answer {
		t.Helper()
		a := w.env.Call(t, http.MethodGet, "/api/v1/storage/buckets/"+w.bucket+"/objects?"+q, w.token, nil, w.project)
		if a.Status != 200 {
			t.Fatalf("list %s: %d %s", q, a.Status, a.Raw)
		}
		return a
	}
	walk := func(q string) (paths, prefixes []string, pages int) {
		cursor := ""
		for {
			qq := q
			if cursor != "" {
				qq += "&cursor=" + url.QueryEscape(cursor)
			}
			a := page(qq)
			pages++
			for _, o := range a.Body["objects"].([]any) {
				paths = append(paths, o.(map[string]any)["path"].(string))
			}
			for _, p := range a.Body["common_prefixes"].([]any) {
				prefixes = append(prefixes, p.(string))
			}
			next, _ := a.Body["pagination"].(map[string]any)["next_cursor"].(string)
			if next == "" {
				return
			}
			cursor = next
		}
	}
	all, _, pages := walk("page_size=37")
	if !slices.Equal(all, want) || pages != 9 {
		t.Fatalf("full walk: %d objects in %d pages", len(all), pages)
	}
	objs, prefixes, _ := walk("delimiter=%2F&page_size=2")
	if !slices.Equal(prefixes, []string{"run0/", "run1/", "run2/"}) || len(objs) != 30 || objs[0] != "top-270" {
		t.Fatalf("folded: prefixes %v, %d objects", prefixes, len(objs))
	}
	objs, prefixes, _ = walk("prefix=run1%2F&delimiter=%2F&page_size=50")
	if len(prefixes) != 0 || len(objs) != 90 || objs[0] != "run1/step-090.ckpt" {
		t.Fatalf("prefix run1/: %v %d", prefixes, len(objs))
	}
	objs, _, _ = walk("prefix=run2%2Fstep-25")
	if len(objs) != 10 || objs[0] != "run2/step-250.ckpt" {
		t.Fatalf("prefix run2/step-25: %v", objs)
	}
	// Cursors after the longest paths still fit the contract's cursor.
	for i := range 3 {
		p := "long/" + strings.Repeat(fmt.Sprint(i), 1019)
		if _, err := w.env.Pool.Exec(ctx, `INSERT INTO storage_objects (bucket, path, project_id, blob_key, size_bytes, etag, content_type, created_at, updated_at)
			SELECT id, $2, project_id, $3, 1, '"x"', 'application/octet-stream', now(), now() FROM storage_buckets WHERE bucket_id = $1`,
			w.bucket, p, "k/"+uuid.NewString()); err != nil {
			t.Fatal(err)
		}
	}
	if objs, _, pages := walk("prefix=long%2F&page_size=1"); len(objs) != 3 || pages != 3 || len(objs[2]) != 1024 {
		t.Fatalf("long paths: %d objects in %d pages", len(objs), pages)
	}
	// A forged cursor, and one from another listing, are refused.
	bad := w.env.Call(t, http.MethodGet, "/api/v1/storage/buckets/"+w.bucket+"/objects?cursor=eyJzIjoib2JqZWN0cyJ9.AAAA", w.token, nil, w.project)
	if bad.Status != 400 || bad.Code() != "invalid_request" {
		t.Fatalf("forged cursor: %d %s", bad.Status, bad.Raw)
	}
	first := page("page_size=1")
	cur := first.Body["pagination"].(map[string]any)["next_cursor"].(string)
	other := w.env.Call(t, http.MethodGet, "/api/v1/storage/buckets/"+w.bucket+"/objects?prefix=run0%2F&cursor="+url.QueryEscape(cur), w.token, nil, w.project)
	if other.Status != 400 || other.Reason() != "cursor_sort_mismatch" {
		t.Fatalf("foreign cursor: %d %s", other.Status, other.Raw)
	}
}

// A grantee with read can read and list but not write; one whose grant is revoked
// loses access at once; a member of another tenant sees nothing.
func TestGrantee(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.put(t, "shared.txt", "shared", nil)
	// A second project of the same tenant with its own member.
	readerID, readerToken := w.env.NewUser(t, w.token, "member")
	var bucketUUID uuid.UUID
	if err := w.env.Pool.QueryRow(ctx, `SELECT id FROM storage_buckets WHERE bucket_id = $1`, w.bucket).Scan(&bucketUUID); err != nil {
		t.Fatal(err)
	}
	grantID := uuid.New()
	if _, err := w.env.Pool.Exec(ctx, `INSERT INTO storage_grants (id, bucket, tenant_id, grantee_kind, grantee_id, access, created_at)
		VALUES ($1, $2, $3, 'user', $4, 'read', now())`, grantID, bucketUUID, w.tenant.ID, readerID); err != nil {
		t.Fatal(err)
	}
	as := func(token string, r *http.Request) *http.Request {
		r.Header.Set("Authorization", "Bearer "+token)
		return r
	}
	// Members of the tenant are not members of the project unless added; the grant is
	// what admits this user.
	if n := w.env.Count(t, `SELECT count(*) FROM project_members WHERE user_id = $1 AND project_id = $2`, readerID, w.tenant.DefaultProject); n != 0 {
		t.Skip("new users join the default project; the grant would not be what admits them")
	}
	resp := w.env.Do(as(readerToken, w.req(t, http.MethodGet, w.bucket, pathQuery("shared.txt"), nil, nil)))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "shared" {
		t.Fatalf("grantee read: %d %s", resp.StatusCode, b)
	}
	put := w.env.Send(t, as(readerToken, w.req(t, http.MethodPut, w.bucket, pathQuery("evil.txt"), strings.NewReader("no"), nil)))
	wantErr(t, put, 403, "insufficient_permissions", "")
	if n := w.env.Count(t, `SELECT count(*) FROM storage_objects WHERE path = 'evil.txt'`); n != 0 {
		t.Fatal("a read grantee wrote an object")
	}
	if _, err := w.env.Pool.Exec(ctx, `DELETE FROM storage_grants WHERE id = $1`, grantID); err != nil {
		t.Fatal(err)
	}
	gone := w.env.Send(t, as(readerToken, w.req(t, http.MethodGet, w.bucket, pathQuery("shared.txt"), nil, nil)))
	if gone.Status != 404 && gone.Status != 403 {
		t.Fatalf("revoked grantee: %d %s", gone.Status, gone.Raw)
	}
	// Another tenant's admin naming our project and bucket: nothing there for them.
	_, root := w.env.PlatformAdmin(t)
	evil := w.env.NewTenant(t, root, "Evil")
	foreign := w.env.Send(t, as(evil.AdminToken, w.req(t, http.MethodGet, w.bucket, pathQuery("shared.txt"), nil, nil)))
	if foreign.Status != 404 && foreign.Status != 403 {
		t.Fatalf("other tenant: %d %s", foreign.Status, foreign.Raw)
	}
}

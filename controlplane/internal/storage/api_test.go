package storage_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
)

const buckets = "/api/v1/storage/buckets"

func bucketPath(id string) string { return buckets + "/" + url.PathEscape(id) }

// putObjects stores n objects of size bytes each in the bucket the way a committed
// upload leaves them (rows and usage; the bytes are not needed by what these tests
// check), so bucket and quota behaviour is tested without the upload engine.
func putObjects(t *testing.T, e *apitest.Env, project uuid.UUID, bucketID string, n int, size int64) {
	t.Helper()
	ctx := context.Background()
	var bucket, tenant uuid.UUID
	if err := e.Pool.QueryRow(ctx, `SELECT id, tenant_id FROM storage_buckets WHERE project_id = $1 AND bucket_id = $2`, project, bucketID).
		Scan(&bucket, &tenant); err != nil {
		t.Fatal(err)
	}
	now := e.App.Clock.Now()
	if _, err := e.Pool.Exec(ctx, `INSERT INTO storage_objects (bucket, path, project_id, blob_key, size_bytes, etag, content_type, created_at, updated_at)
		SELECT $1::uuid, 'dir/obj-' || lpad(i::text, 6, '0'), $2, 't/' || $1::uuid::text || '/' || gen_random_uuid()::text, $3, '"x"', 'application/octet-stream', $4, $4
		FROM generate_series(1, $5) AS i`, bucket, project, size, now, n); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO storage_quotas (project_id, tenant_id, used_bytes, used_objects, updated_at)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (project_id) DO UPDATE
		SET used_bytes = storage_quotas.used_bytes + EXCLUDED.used_bytes, used_objects = storage_quotas.used_objects + EXCLUDED.used_objects`,
		project, tenant, size*int64(n), n, now); err != nil {
		t.Fatal(err)
	}
}

// usage is the project's quota row (zeros when none) and the recount from its objects.
func usage(t *testing.T, e *apitest.Env, project uuid.UUID) (used, usedObjects, sum, count int64) {
	t.Helper()
	ctx := context.Background()
	_ = e.Pool.QueryRow(ctx, `SELECT used_bytes, used_objects FROM storage_quotas WHERE project_id = $1`, project).Scan(&used, &usedObjects)
	var err error
	if sum, count, err = e.App.Storage.Recount(ctx, project); err != nil {
		t.Fatal(err)
	}
	return used, usedObjects, sum, count
}

func audits(t *testing.T, e *apitest.Env, action, target string) int {
	t.Helper()
	return e.Count(t, `SELECT count(*) FROM audit_events WHERE action = $1 AND target_id = $2`, action, target)
}

func TestBucketLifecycle(t *testing.T) {
	e := apitest.New(t)
	_, root := e.PlatformAdmin(t)
	ten := e.NewTenant(t, root, "Buckets")
	_, viewerTok := e.NewUser(t, ten.AdminToken, "member") // a tenant member without a role in the project
	proj := ten.DefaultProject.String()
	tok := ten.AdminToken

	a := e.Call(t, "POST", buckets, tok, map[string]any{"bucket_id": "datasets"}, proj)
	if a.Status != 201 || a.Str("bucket_id") != "datasets" || a.Str("state") != "active" || a.Body["size_bytes"] != 0.0 ||
		a.Body["object_count"] != 0.0 || a.Str("access") != "read_write" {
		t.Fatalf("create: %d %s", a.Status, a.Raw)
	}
	var id string
	if err := e.Pool.QueryRow(context.Background(), `SELECT id::text FROM storage_buckets WHERE bucket_id = 'datasets'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if audits(t, e, "storage.bucket.create", id) != 1 ||
		e.Count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'storage.bucket.created' AND payload->>'bucket' = $1`, id) != 1 {
		t.Fatal("create: audit row or event missing")
	}
	if a := e.Call(t, "POST", buckets, tok, map[string]any{"bucket_id": "datasets"}, proj); a.Status != 409 || a.Code() != "storage_already_exists" {
		t.Fatalf("duplicate: %d %s", a.Status, a.Raw)
	}

	// bucket_id at the edges of the seed's pattern: 1 and 128 characters and every
	// allowed punctuation pass; 129, an empty id and a bad first character do not, and
	// nothing is stored for them.
	ok := []string{"a", "Z", "9", strings.Repeat("b", 128), "a:b_c.d/e-f", "ckpt/run-1"}
	for _, id := range ok {
		if a := e.Call(t, "POST", buckets, tok, map[string]any{"bucket_id": id}, proj); a.Status != 201 || a.Str("bucket_id") != id {
			t.Errorf("bucket_id %q: %d %s", id, a.Status, a.Raw)
		}
		if a := e.Call(t, "GET", bucketPath(id), tok, nil, proj); a.Status != 200 || a.Str("bucket_id") != id {
			t.Errorf("get %q: %d %s", id, a.Status, a.Raw)
		}
	}
	before := e.Count(t, `SELECT count(*) FROM storage_buckets`)
	bad := []string{"", strings.Repeat("c", 129), "-a", "_a", ".a", "/a", ":a", "a b", "a*", "ä", "a\x00b"}
	for _, id := range bad {
		a := e.Call(t, "POST", buckets, tok, map[string]any{"bucket_id": id}, proj)
		if a.Status != 422 || a.Code() != "validation_error" {
			t.Errorf("bad bucket_id %q: %d %s", id, a.Status, a.Raw)
		}
	}
	for _, id := range []string{strings.Repeat("c", 129), "-a", "_a"} {
		if a := e.Call(t, "GET", bucketPath(id), tok, nil, proj); a.Status != 422 || a.Code() != "validation_error" {
			t.Errorf("get bad bucket_id %q: %d %s", id, a.Status, a.Raw)
		}
	}
	if after := e.Count(t, `SELECT count(*) FROM storage_buckets`); after != before {
		t.Fatalf("refused creates stored buckets: %d -> %d", before, after)
	}

	// Listing pages by bucket_id in byte order; a cursor of another project is refused.
	var seen []string
	cursor := ""
	for range 10 {
		q := "?page_size=2"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		a := e.Call(t, "GET", buckets+q, tok, nil, proj)
		if a.Status != 200 {
			t.Fatalf("list: %d %s", a.Status, a.Raw)
		}
		for _, it := range a.Body["items"].([]any) {
			seen = append(seen, it.(map[string]any)["bucket_id"].(string))
		}
		pg := a.Body["pagination"].(map[string]any)
		next, _ := pg["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = next
	}
	want := append([]string{"datasets"}, ok...)
	if len(seen) != len(want) {
		t.Fatalf("listed %v, want %d buckets", seen, len(want))
	}
	for i := 1; i < len(seen); i++ {
		if seen[i-1] >= seen[i] {
			t.Fatalf("not in byte order: %v", seen)
		}
	}

	// A tenant member without a role in the project: the bucket is not theirs to see.
	if a := e.Call(t, "GET", bucketPath("datasets"), viewerTok, nil, proj); a.Status != 404 || a.Code() != "storage_object_not_found" {
		t.Fatalf("stranger get: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "GET", buckets, viewerTok, nil, proj); a.Status != 403 || a.Code() != "insufficient_permissions" {
		t.Fatalf("stranger list: %d %s", a.Status, a.Raw)
	}

	// An empty bucket is deleted at once.
	if a := e.Call(t, "DELETE", bucketPath("datasets"), tok, nil, proj); a.Status != 204 {
		t.Fatalf("delete: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "GET", bucketPath("datasets"), tok, nil, proj); a.Status != 404 || a.Code() != "storage_object_not_found" {
		t.Fatalf("get deleted: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "DELETE", bucketPath("datasets"), tok, nil, proj); a.Status != 404 {
		t.Fatalf("delete again: %d %s", a.Status, a.Raw)
	}
	if audits(t, e, "storage.bucket.delete", id) != 1 ||
		e.Count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'storage.bucket.deleted' AND payload->>'bucket' = $1`, id) != 1 {
		t.Fatal("delete: audit row or event missing")
	}
	// The id is free again.
	if a := e.Call(t, "POST", buckets, tok, map[string]any{"bucket_id": "datasets"}, proj); a.Status != 201 {
		t.Fatalf("recreate: %d %s", a.Status, a.Raw)
	}
}

// TestForceDeleteFreesQuota: a bucket with objects is refused a plain delete; a forced
// one marks it deleting and the sweeper removes its objects in batches, freeing quota
// as it goes (usage always equals the recount), then the bucket.
func TestForceDeleteFreesQuota(t *testing.T) {
	e := apitest.New(t, apitest.WithConfig(func(c *app.Config) { c.Storage.SweepBatch = 500; c.Storage.SweepInterval = -1 }))
	ctx := context.Background()
	_, root := e.PlatformAdmin(t)
	ten := e.NewTenant(t, root, "Force")
	proj, tok := ten.DefaultProject, ten.AdminToken
	for _, b := range []string{"big", "keep"} {
		if a := e.Call(t, "POST", buckets, tok, map[string]any{"bucket_id": b}, proj.String()); a.Status != 201 {
			t.Fatalf("create: %d %s", a.Status, a.Raw)
		}
	}
	putObjects(t, e, proj, "big", 1200, 1000)
	putObjects(t, e, proj, "keep", 3, 7)

	a := e.Call(t, "DELETE", bucketPath("big"), tok, nil, proj.String())
	if a.Status != 409 || a.Code() != "invalid_request" || a.Reason() != "bucket_not_empty" {
		t.Fatalf("delete non-empty: %d %s", a.Status, a.Raw)
	}
	if n := e.Count(t, `SELECT count(*) FROM storage_objects o JOIN storage_buckets b ON b.id = o.bucket WHERE b.bucket_id = 'big'`); n != 1200 {
		t.Fatalf("refused delete removed objects: %d left", n)
	}
	a = e.Call(t, "DELETE", bucketPath("big")+"?force=true", tok, nil, proj.String())
	if a.Status != 202 || a.Str("state") != "deleting" || a.Body["object_count"] != 1200.0 {
		t.Fatalf("force delete: %d %s", a.Status, a.Raw)
	}
	// Gone for object operations, still visible to the project while it drains.
	if a := e.Call(t, "GET", bucketPath("big"), tok, nil, proj.String()); a.Status != 200 || a.Str("state") != "deleting" {
		t.Fatalf("get deleting: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "POST", buckets, tok, map[string]any{"bucket_id": "big"}, proj.String()); a.Status != 409 {
		t.Fatalf("create over a deleting bucket: %d %s", a.Status, a.Raw)
	}

	wantLeft := []int64{700, 200, 0}
	for i, left := range wantLeft {
		res, err := e.App.Storage.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		used, objs, sum, count := usage(t, e, proj)
		if used != sum || objs != count {
			t.Fatalf("pass %d: usage %d/%d but objects sum to %d/%d", i, used, objs, sum, count)
		}
		if count != left+3 || used != left*1000+21 {
			t.Fatalf("pass %d (%+v): %d objects, %d bytes left", i, res, count, used)
		}
	}
	res, err := e.App.Storage.Sweep(ctx) // the empty bucket goes
	if err != nil || res.Buckets != 1 {
		t.Fatalf("final pass: %+v %v", res, err)
	}
	if a := e.Call(t, "GET", bucketPath("big"), tok, nil, proj.String()); a.Status != 404 {
		t.Fatalf("get after sweep: %d %s", a.Status, a.Raw)
	}
	if a := e.Call(t, "GET", bucketPath("keep"), tok, nil, proj.String()); a.Status != 200 || a.Body["object_count"] != 3.0 || a.Body["size_bytes"] != 21.0 {
		t.Fatalf("other bucket: %d %s", a.Status, a.Raw)
	}
	if n := e.Count(t, `SELECT count(*) FROM storage_blob_gc`); n != 0 {
		t.Fatalf("%d blobs still queued", n)
	}
	q := e.Call(t, "GET", "/api/v1/storage/quota", tok, nil, proj.String())
	if q.Status != 200 || q.Body["used_bytes"] != 21.0 || q.Body["used_objects"] != 3.0 {
		t.Fatalf("quota: %d %s", q.Status, q.Raw)
	}
	if e.Count(t, `SELECT count(*) FROM audit_events WHERE action = 'storage.bucket.deleted' AND actor_type = 'system'`) != 1 ||
		e.Count(t, `SELECT count(*) FROM outbox_events WHERE event_type IN ('storage.bucket.deleting', 'storage.bucket.deleted')`) != 2 {
		t.Fatal("force delete: audit rows or events missing")
	}
}

// TestExpiredUploadIsFreed: a reservation whose upload stopped (its process died) is
// given back by the sweeper and its half-written blob queued and deleted.
func TestExpiredUploadIsFreed(t *testing.T) {
	e := apitest.New(t, apitest.WithConfig(func(c *app.Config) { c.Storage.SweepInterval = -1 }))
	ctx := context.Background()
	_, root := e.PlatformAdmin(t)
	ten := e.NewTenant(t, root, "Crash")
	proj := ten.DefaultProject
	if a := e.Call(t, "POST", buckets, ten.AdminToken, map[string]any{"bucket_id": "b"}, proj.String()); a.Status != 201 {
		t.Fatalf("create: %d %s", a.Status, a.Raw)
	}
	now := e.App.Clock.Now()
	if _, err := e.Pool.Exec(ctx, `INSERT INTO storage_quotas (project_id, tenant_id, reserved_bytes, reserved_objects, updated_at) VALUES ($1, $2, 5000, 2, $3)`,
		proj, ten.ID, now); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO storage_uploads (id, project_id, bucket, blob_key, reserved_bytes, reserved_objects, started_at, expires_at)
		SELECT $1::uuid, $2::uuid, id, 'crashed-1', 3000, 1, $3::timestamptz, $3::timestamptz - interval '1 minute' FROM storage_buckets WHERE bucket_id = 'b'
		UNION ALL SELECT $4::uuid, $2::uuid, id, 'live-1', 2000, 1, $3::timestamptz, $3::timestamptz + interval '1 hour' FROM storage_buckets WHERE bucket_id = 'b'`,
		uuid.New(), proj, now, uuid.New()); err != nil {
		t.Fatal(err)
	}
	res, err := e.App.Storage.Sweep(ctx)
	if err != nil || res.ExpiredUploads != 1 {
		t.Fatalf("sweep: %+v %v", res, err)
	}
	var rb, ro int64
	if err := e.Pool.QueryRow(ctx, `SELECT reserved_bytes, reserved_objects FROM storage_quotas WHERE project_id = $1`, proj).Scan(&rb, &ro); err != nil {
		t.Fatal(err)
	}
	if rb != 2000 || ro != 1 || e.Count(t, `SELECT count(*) FROM storage_uploads`) != 1 ||
		e.Count(t, `SELECT count(*) FROM storage_uploads WHERE blob_key = 'live-1'`) != 1 {
		t.Fatalf("after sweep: reserved %d/%d", rb, ro)
	}
	if n := e.Count(t, `SELECT count(*) FROM storage_blob_gc`); n != 0 {
		t.Fatalf("blob of the crashed upload still queued: %d", n)
	}
	q := e.Call(t, "GET", "/api/v1/storage/quota", ten.AdminToken, nil, proj.String())
	if q.Status != 200 || q.Body["reserved_bytes"] != 2000.0 || q.Body["reserved_objects"] != 1.0 {
		t.Fatalf("quota: %d %s", q.Status, q.Raw)
	}
}

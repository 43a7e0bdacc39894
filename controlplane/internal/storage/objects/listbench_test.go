package objects_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkListStorageObjects is one flat page of 200 objects through the whole chain
// (authentication, project context, bucket access, contract validation of the request,
// the listing query, the JSON answer), in-process without a socket, so its CPU and
// allocation profile is the server's alone:
//
//	go test -run '^$' -bench ListStorageObjects -benchmem -cpuprofile cpu.out ./controlplane/internal/storage/objects
func BenchmarkListStorageObjects(b *testing.B) {
	w := newWorld(b)
	ctx := context.Background()
	if _, err := w.env.Pool.Exec(ctx, `INSERT INTO storage_objects (bucket, path, project_id, blob_key, size_bytes, etag, content_type, created_at, updated_at)
		SELECT b.id, format('run%s/ckpt-%s.bin', lpad((i / 1000)::text, 3, '0'), lpad(i::text, 6, '0')), b.project_id,
		       'bench/' || i, 1024, '"' || md5(i::text) || md5(i::text) || '"', 'application/octet-stream', now(), now()
		FROM storage_buckets b, generate_series(0, 1999) AS i WHERE b.bucket_id = $1`, w.bucket); err != nil {
		b.Fatal(err)
	}
	h := w.env.App.Handler
	target := "/api/v1/storage/buckets/" + w.bucket + "/objects?page_size=200&prefix=run001%2F"
	serve := func() {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Header.Set("Authorization", "Bearer "+w.token)
		r.Header.Set("X-Project-ID", w.project)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusOK {
			b.Fatalf("list: %d %s", rec.Code, rec.Body)
		}
	}
	serve() // warm: verified token, prepared statements
	b.ReportAllocs()
	for b.Loop() {
		serve()
	}
}

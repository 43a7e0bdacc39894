package objects_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob/s3test"
)

// The core object operations once more with the S3 driver against a real S3 server
// (versitygw, storage/blob/s3test): round trip, range, create-only, replace, delete.
func TestObjectsOverS3(t *testing.T) {
	srv := s3test.Shared(t)
	bucket := srv.NewBucket(t)
	w := newWorld(t, func(c *app.Config) { c.Blob.Driver, c.Blob.S3 = "s3", srv.Config(bucket) })
	body := strings.Repeat("s3 bytes ", 1000)
	a := w.put(t, "a/b.txt", body, map[string]string{"Content-Type": "text/plain", "If-None-Match": "*"})
	if a.Status != 200 || a.Str("etag") != etagOf(body) {
		t.Fatalf("put: %d %s", a.Status, a.Raw)
	}
	wantErr(t, w.put(t, "a/b.txt", "again", map[string]string{"If-None-Match": "*"}), 409, "storage_already_exists", "")
	status, h, got := w.get(t, http.MethodGet, "a/b.txt", nil)
	if status != 200 || got != body || h.Get("Content-Type") != "text/plain" || h.Get("ETag") != etagOf(body) {
		t.Fatalf("get: %d %v", status, h)
	}
	if status, h, got := w.get(t, http.MethodGet, "a/b.txt", map[string]string{"Range": "bytes=-5"}); status != 206 || got != body[len(body)-5:] ||
		h.Get("Content-Range") != "bytes 8995-8999/9000" {
		t.Fatalf("range: %d %q %v", status, got, h)
	}
	if a := w.put(t, "a/b.txt", "replaced", nil); a.Status != 200 {
		t.Fatalf("replace: %s", a.Raw)
	}
	if _, _, got := w.get(t, http.MethodGet, "a/b.txt", nil); got != "replaced" {
		t.Fatalf("after replace: %q", got)
	}
	if a := w.env.Send(t, w.req(t, http.MethodDelete, w.bucket, pathQuery("a/b.txt"), nil, nil)); a.Status != 204 {
		t.Fatalf("delete: %d %s", a.Status, a.Raw)
	}
	w.usage(t, w.project).exact(t)
	// Both versions are gone from the S3 bucket (the replaced one after its commit,
	// the last with the delete).
	names, err := w.env.App.Blob.(blob.Inventory).Inventory(context.Background())
	if err != nil || len(names) != 0 {
		t.Fatalf("left in S3: %v %v", names, err)
	}
}

package objects_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects"
)

const limit = 4 << 20 // the per-PUT limit these tests run with

func lowLimit(c *app.Config) { c.Storage.MaxObjectBytes = limit }

func TestInterruptedAndMalformedUploads(t *testing.T) {
	w := newWorld(t, lowLimit)
	w.put(t, "keep", "kept", nil)
	before := w.usage(t, w.project)
	blobsBefore := files(t, w.root)

	// A body shorter than its Content-Length, the client half-closing: a clear 400.
	conn, br := w.rawPut(t, "short", "Content-Length: 100\r\n", bytes.Repeat([]byte("s"), 50))
	_ = conn.(interface{ CloseWrite() error }).CloseWrite()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(body), "body_length_mismatch") {
		t.Fatalf("short body: %d %s", resp.StatusCode, body)
	}

	// A client that disconnects mid-upload: nothing visible, the quota back to before.
	conn, _ = w.rawPut(t, "cut", "Content-Length: 3000000\r\n", bytes.Repeat([]byte("c"), 1<<20))
	_ = conn.Close()
	// Chunked, cut in the middle of a chunk.
	conn, _ = w.rawPut(t, "cut-chunked", "Transfer-Encoding: chunked\r\n", []byte("100000\r\n"+strings.Repeat("x", 5000)))
	_ = conn.Close()
	after := w.waitSettled(t, w.project)
	after.exact(t)
	if after.usedBytes != before.usedBytes || after.usedObjects != before.usedObjects {
		t.Fatalf("usage moved: %+v -> %+v", before, after)
	}

	// Over the per-PUT limit with a Content-Length: refused before a byte is read.
	big := w.env.Send(t, w.req(t, http.MethodPut, w.bucket, pathQuery("big"), io.LimitReader(zeros{}, limit+1), nil))
	wantErr(t, big, 413, "storage_quota_exceeded", "object_too_large")
	// Chunked (no Content-Length): refused as the bytes pass the limit.
	r := w.req(t, http.MethodPut, w.bucket, pathQuery("big-chunked"), io.MultiReader(io.LimitReader(zeros{}, limit+1)), nil)
	r.ContentLength = -1
	r.Body = io.NopCloser(io.LimitReader(zeros{}, limit+1))
	wantErr(t, w.env.Send(t, r), 413, "storage_quota_exceeded", "object_too_large")
	// Exactly the limit, chunked, is fine.
	r = w.req(t, http.MethodPut, w.bucket, pathQuery("at-limit"), nil, nil)
	r.ContentLength = -1
	r.Body = io.NopCloser(io.LimitReader(zeros{}, limit))
	if a := w.env.Send(t, r); a.Status != 200 || a.Body["size_bytes"] != float64(limit) {
		t.Fatalf("at the limit: %d %s", a.Status, a.Raw)
	}
	if _, err := w.env.Pool.Exec(context.Background(), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	w.waitSettled(t, w.project).exact(t)
	if n := w.env.Count(t, `SELECT count(*) FROM storage_objects WHERE path IN ('short', 'cut', 'cut-chunked', 'big', 'big-chunked')`); n != 0 {
		t.Fatalf("%d refused uploads became objects", n)
	}
	if got := files(t, w.root); len(got) != len(blobsBefore)+1 {
		t.Fatalf("blobs %v (before %v): a refused upload left bytes", got, blobsBefore)
	}

	// A body longer than its Content-Length: over HTTP/1.1 the declared bytes are the
	// request and the surplus is the connection's next one, which cannot be parsed
	// (400, connection closed). Through ObjectAccess (the fabric's writes) a reader
	// longer than its size is refused and nothing is kept.
	_, br = w.rawPut(t, "long", "Content-Length: 4\r\n", []byte("abcdEXTRA\r\n\r\n"))
	first, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, first.Body)
	second, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, second.Body)
	if first.StatusCode != 200 || second.StatusCode != 400 {
		t.Fatalf("longer body over HTTP/1.1: %d then %d", first.StatusCode, second.StatusCode)
	}
	if _, _, got := w.get(t, http.MethodGet, "long", nil); got != "abcd" {
		t.Fatalf("the declared bytes: %q", got)
	}
	store := w.env.App.Objects
	var b objects.Bucket
	if err := w.env.Pool.QueryRow(context.Background(), `SELECT id, tenant_id, project_id, bucket_id FROM storage_buckets WHERE bucket_id = $1`, w.bucket).
		Scan(&b.ID, &b.TenantID, &b.ProjectID, &b.BucketID); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(context.Background(), b, objects.PutInput{Path: "longer", Body: strings.NewReader("0123456789"), Size: 4}); err == nil {
		t.Fatal("a reader longer than its size was stored")
	}
	if _, err := store.Put(context.Background(), b, objects.PutInput{Path: "shorter", Body: strings.NewReader("01"), Size: 4}); err == nil {
		t.Fatal("a reader shorter than its size was stored")
	}
	if n := w.env.Count(t, `SELECT count(*) FROM storage_objects WHERE path IN ('longer', 'shorter')`); n != 0 {
		t.Fatal("a mismatched ObjectAccess write was kept")
	}
	w.waitSettled(t, w.project).exact(t)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Twenty uploads at once against a quota that holds eight: usage never passes it, and
// afterwards equals the stored objects exactly.
func TestConcurrentUploadsAgainstQuota(t *testing.T) {
	const size, fit = 100 << 10, 8
	w := newWorld(t)
	ctx := context.Background()
	if _, err := w.env.Pool.Exec(ctx, `INSERT INTO storage_tenant_quotas (tenant_id, max_bytes, max_objects, updated_at) VALUES ($1, $2, 1000, now())`,
		w.tenant.ID, fit*size); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	statuses := make([]int, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Half with a Content-Length (reserved up front), half chunked (in steps).
			r := w.req(t, http.MethodPut, w.bucket, pathQuery(fmt.Sprintf("c/%02d", i)), bytes.NewReader(bytes.Repeat([]byte{byte(i)}, size)), nil)
			if i%2 == 1 {
				r.ContentLength = -1
				r.Body = io.NopCloser(bytes.NewReader(bytes.Repeat([]byte{byte(i)}, size)))
			}
			resp, err := w.env.HTTPClient().Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		}()
	}
	// Meanwhile the usage never passes the limit.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		u := w.usage(t, w.project)
		if u.usedBytes+u.reservedBytes > fit*size {
			t.Fatalf("usage %+v passed the quota %d", u, fit*size)
		}
	}
	ok := 0
	for i, s := range statuses {
		switch s {
		case 200:
			ok++
		case 429:
		default:
			t.Errorf("upload %d: %d", i, s)
		}
	}
	u := w.waitSettled(t, w.project)
	u.exact(t)
	if ok == 0 || ok > fit || u.usedBytes != int64(ok)*size || u.usedObjects != int64(ok) {
		t.Fatalf("%d stored, usage %+v", ok, u)
	}
	if got := len(files(t, w.root)); got != ok {
		t.Fatalf("%d blobs for %d objects", got, ok)
	}
}

// A full quota refuses with 429 storage_quota_exceeded (ARCHITECTURE §3), reason
// quota_exhausted, whether the size was declared, the body was chunked, or the object
// count is full; nothing of a refused upload is kept.
func TestFullQuotaIs429(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	if _, err := w.env.Pool.Exec(ctx, `INSERT INTO storage_tenant_quotas (tenant_id, max_bytes, max_objects, updated_at) VALUES ($1, 1000, 2, now())`,
		w.tenant.ID); err != nil {
		t.Fatal(err)
	}
	put := func(path string, n int, chunked bool) apitest.Answer {
		r := w.req(t, http.MethodPut, w.bucket, pathQuery(path), bytes.NewReader(bytes.Repeat([]byte{'q'}, n)), nil)
		if chunked {
			r.ContentLength = -1
			r.Body = io.NopCloser(bytes.NewReader(bytes.Repeat([]byte{'q'}, n)))
		}
		return w.env.Send(t, r)
	}
	if a := put("first", 600, false); a.Status != 200 {
		t.Fatalf("first upload: %d %s", a.Status, a.Raw)
	}
	declared := put("declared", 600, false)
	wantErr(t, declared, 429, "storage_quota_exceeded", "quota_exhausted")
	if d, _ := declared.Body["details"].(map[string]any); d["chunked"] != false {
		t.Fatalf("declared refusal details: %v", d)
	}
	chunked := put("chunked", 600, true)
	wantErr(t, chunked, 429, "storage_quota_exceeded", "quota_exhausted")
	if d, _ := chunked.Body["details"].(map[string]any); d["chunked"] != true {
		t.Fatalf("chunked refusal details: %v", d)
	}
	if a := put("second", 100, false); a.Status != 200 {
		t.Fatalf("an upload that fits: %d %s", a.Status, a.Raw)
	}
	wantErr(t, put("third", 1, false), 429, "storage_quota_exceeded", "quota_exhausted") // two objects is the limit
	if n := w.env.Count(t, `SELECT count(*) FROM storage_objects WHERE path IN ('declared', 'chunked', 'third')`); n != 0 {
		t.Fatalf("%d refused uploads were kept", n)
	}
	u := w.waitSettled(t, w.project)
	u.exact(t)
	if u.usedBytes != 700 || u.usedObjects != 2 {
		t.Fatalf("usage %+v, want 700 bytes in 2 objects", u)
	}
}

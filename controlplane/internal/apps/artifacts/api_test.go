package artifacts_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func want(t *testing.T, a apitest.Answer, status int, code string) {
	t.Helper()
	if a.Status != status || (code != "" && a.Code() != code) {
		t.Fatalf("got %d %s, want %d %s: %s", a.Status, a.Code(), status, code, a.Raw)
	}
}

func put(t *testing.T, e *apitest.Env, token, project, id, path string, body []byte) apitest.Answer {
	t.Helper()
	req, err := http.NewRequest("PUT", e.Server.URL+"/api/v1/app-artifacts/"+id+"/files?path="+url.QueryEscape(path), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Project-ID", project)
	req.Header.Set("Content-Type", "application/octet-stream")
	return e.Send(t, req)
}

func get(t *testing.T, e *apitest.Env, token, project, id, path string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest("GET", e.Server.URL+"/api/v1/app-artifacts/"+id+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Project-ID", project)
	resp := e.Do(req)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp, data, err
}

// getRaw reads a file without the validating client (which would itself report the
// cut-short body): the error is the transport's or the body's.
func getRaw(t *testing.T, e *apitest.Env, token, project, id, path string) ([]byte, error) {
	t.Helper()
	req, err := http.NewRequest("GET", e.Server.URL+"/api/v1/app-artifacts/"+id+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Project-ID", project)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// blobFiles are the artifact blobs on disk.
func blobFiles(t *testing.T, e *apitest.Env) []string {
	t.Helper()
	var out []string
	root := e.App.Config.Blob.FSRoot
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(p, "app-artifacts") {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestArtifactRoundTripAndDigestOnRead(t *testing.T) {
	e := apitest.New(t, apitest.WithConfig(func(c *app.Config) { c.Storage.MaxObjectBytes = 8 << 20 }))
	_, admin := e.PlatformAdmin(t)
	ta, tb := e.NewTenant(t, admin, "A"), e.NewTenant(t, admin, "B")
	pa := ta.DefaultProject.String()

	a := e.Call(t, "POST", "/api/v1/app-artifacts", ta.AdminToken, map[string]any{"name": "weights", "version": "v1", "kind": "model"}, pa)
	want(t, a, 201, "")
	id := a.Str("id")
	if a.Body["content_digest"] != nil || a.Body["file_count"].(float64) != 0 || !strings.HasPrefix(a.Str("storage_location"), "fs:app-artifacts/"+id+"/") {
		t.Fatalf("new artifact: %s", a.Raw)
	}
	want(t, e.Call(t, "POST", "/api/v1/app-artifacts", ta.AdminToken, map[string]any{"name": "weights", "version": "v1", "kind": "model"}, pa), 409, "storage_already_exists")

	big := random(t, 3<<20+17)
	small := []byte("print('hello')\n")
	f := put(t, e, ta.AdminToken, pa, id, "model/weights.bin", big)
	want(t, f, 201, "")
	sum := sha256.Sum256(big)
	if f.Str("digest") != "sha256:"+hex.EncodeToString(sum[:]) || f.Body["size_bytes"].(float64) != float64(len(big)) {
		t.Fatalf("file: %s", f.Raw)
	}
	want(t, put(t, e, ta.AdminToken, pa, id, "notebook.ipynb", small), 201, "")
	want(t, put(t, e, ta.AdminToken, pa, id, "empty", nil), 201, "")

	// Refusals, each leaving nothing behind.
	blobs := len(blobFiles(t, e))
	want(t, put(t, e, ta.AdminToken, pa, id, "notebook.ipynb", small), 409, "storage_already_exists")
	want(t, put(t, e, ta.AdminToken, pa, id, "../escape", small), 400, "storage_path_traversal")
	want(t, put(t, e, ta.AdminToken, pa, id, strings.Repeat("p", 1025), small), 422, "validation_error")
	want(t, put(t, e, ta.AdminToken, pa, id, "too-big", random(t, 8<<20+1)), 413, "storage_quota_exceeded")
	want(t, put(t, e, tb.AdminToken, tb.DefaultProject.String(), id, "x", small), 404, "storage_object_not_found")
	want(t, put(t, e, tb.AdminToken, pa, id, "x", small), 403, "insufficient_permissions")
	if n := len(blobFiles(t, e)); n != blobs {
		t.Fatalf("%d blobs after refusals, want %d", n, blobs)
	}
	// Exactly at the limit is accepted.
	want(t, put(t, e, ta.AdminToken, pa, id, "at-limit", random(t, 8<<20)), 201, "")

	g := e.Call(t, "GET", "/api/v1/app-artifacts/"+id, ta.AdminToken, nil, pa)
	want(t, g, 200, "")
	if g.Body["file_count"].(float64) != 4 || g.Str("content_digest") == "" {
		t.Fatalf("artifact: %s", g.Raw)
	}
	want(t, e.Call(t, "GET", "/api/v1/app-artifacts/"+id, tb.AdminToken, nil, tb.DefaultProject.String()), 404, "storage_object_not_found")

	resp, data, err := get(t, e, ta.AdminToken, pa, id, "model/weights.bin")
	if err != nil || resp.StatusCode != 200 || !bytes.Equal(data, big) || resp.Header.Get("ETag") != `"`+hex.EncodeToString(sum[:])+`"` {
		t.Fatalf("read back: %v %d %d bytes etag %s", err, resp.StatusCode, len(data), resp.Header.Get("ETag"))
	}
	if _, data, err := get(t, e, ta.AdminToken, pa, id, "empty"); err != nil || len(data) != 0 {
		t.Fatalf("empty: %v %d", err, len(data))
	}

	// Change stored bytes behind the artifact's back: the read is cut short, never
	// served whole, and counted.
	var weights string
	for _, p := range blobFiles(t, e) {
		if st, _ := os.Stat(p); st != nil && st.Size() == int64(len(big)) {
			weights = p
		}
	}
	if weights == "" {
		t.Fatal("weights blob not found")
	}
	corrupt := append([]byte(nil), big...)
	corrupt[len(corrupt)/2] ^= 0xff
	if err := os.WriteFile(weights, corrupt, 0o600); err != nil {
		t.Fatal(err)
	}
	data, err = getRaw(t, e, ta.AdminToken, pa, id, "model/weights.bin")
	if err == nil || len(data) >= len(big) {
		t.Fatalf("corrupted file served whole: err %v, %d of %d bytes", err, len(data), len(big))
	}
	// Shorter stored bytes: the same.
	if err := os.WriteFile(weights, big[:1000], 0o600); err != nil {
		t.Fatal(err)
	}
	if data, err = getRaw(t, e, ta.AdminToken, pa, id, "model/weights.bin"); err == nil || len(data) >= len(big) {
		t.Fatalf("truncated file served: err %v, %d bytes", err, len(data))
	}
	if n := testutil.ToFloat64(e.App.Artifacts.DigestMismatches); n != 2 {
		t.Fatalf("mismatches counted %v, want 2", n)
	}

	// Listing.
	want(t, e.Call(t, "POST", "/api/v1/app-artifacts", ta.AdminToken, map[string]any{"name": "notebook", "version": "1", "kind": "notebook"}, pa), 201, "")
	l := e.Call(t, "GET", "/api/v1/app-artifacts?page_size=1", ta.AdminToken, nil, pa)
	want(t, l, 200, "")
	items := l.Body["items"].([]any)
	next, _ := l.Body["pagination"].(map[string]any)["next_cursor"].(string)
	if len(items) != 1 || items[0].(map[string]any)["name"] != "notebook" || next == "" {
		t.Fatalf("page 1: %s", l.Raw)
	}
	l = e.Call(t, "GET", "/api/v1/app-artifacts?page_size=1&cursor="+next, ta.AdminToken, nil, pa)
	if items := l.Body["items"].([]any); len(items) != 1 || items[0].(map[string]any)["name"] != "weights" {
		t.Fatalf("page 2: %s", l.Raw)
	}
	// The launch check of app instances: the project's artifacts only.
	own := uuid.MustParse(id)
	if err := e.App.Artifacts.CheckProjectArtifacts(context.Background(), ta.DefaultProject, []uuid.UUID{own}); err != nil {
		t.Fatalf("own artifact refused: %v", err)
	}
	err = e.App.Artifacts.CheckProjectArtifacts(context.Background(), tb.DefaultProject, []uuid.UUID{own})
	if ae, ok := apierr.As(err); !ok || ae.Code != apierr.ValidationError || ae.Details["reason"] != "artifact_not_found" {
		t.Fatalf("another project's artifact: %v", err)
	}
	if n := e.Count(t, `SELECT count(*) FROM audit_events WHERE action LIKE 'app_artifact.%'`); n != 2+4 {
		t.Fatalf("%d audit rows, want 6", n)
	}
}

package objects_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
)

// world is one control plane with a tenant, its admin and a bucket in its default
// project, and the fs driver's root.
type world struct {
	env     *apitest.Env
	root    string // the fs driver's directory
	tenant  apitest.Tenant
	token   string
	project string
	bucket  string
}

func newWorld(t testing.TB, opts ...func(*app.Config)) *world {
	t.Helper()
	parent := t.TempDir()
	root := filepath.Join(parent, "root")
	env := apitest.New(t, apitest.WithConfig(func(c *app.Config) {
		c.Blob.Driver, c.Blob.FSRoot = "fs", root
		for _, o := range opts {
			o(c)
		}
	}))
	_, admin := env.PlatformAdmin(t)
	acme := env.NewTenant(t, admin, "Acme")
	w := &world{env: env, root: root, tenant: acme, token: acme.AdminToken, project: acme.DefaultProject.String()}
	w.bucket = w.newBucket(t, acme.ID, acme.DefaultProject, "data")
	return w
}

// newBucket creates an active bucket row (the bucket API is the storage package's; the
// object tests need only the row).
func (w *world) newBucket(t testing.TB, tenant, project uuid.UUID, bucketID string) string {
	t.Helper()
	_, err := w.env.Pool.Exec(context.Background(), `INSERT INTO storage_buckets (id, tenant_id, project_id, bucket_id, state, created_at, updated_at)
		VALUES ($1, $2, $3, $4, 'active', now(), now())`, uuid.New(), tenant, project, bucketID)
	if err != nil {
		t.Fatalf("bucket fixture: %v", err)
	}
	return bucketID
}

func (w *world) objectURL(bucket, rawQuery string) string {
	return w.env.Server.URL + "/api/v1/storage/buckets/" + url.PathEscape(bucket) + "/object?" + rawQuery
}

func pathQuery(p string) string { return "path=" + url.QueryEscape(p) }

// req builds an object request as the world's admin.
func (w *world) req(t *testing.T, method, bucket, rawQuery string, body io.Reader, hdr map[string]string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, w.objectURL(bucket, rawQuery), body)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+w.token)
	r.Header.Set("X-Project-ID", w.project)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	return r
}

func (w *world) put(t *testing.T, path, body string, hdr map[string]string) apitest.Answer {
	t.Helper()
	return w.env.Send(t, w.req(t, http.MethodPut, w.bucket, pathQuery(path), strings.NewReader(body), hdr))
}

// get returns status, headers and body of a GET (or HEAD).
func (w *world) get(t *testing.T, method, path string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	resp := w.env.Do(w.req(t, method, w.bucket, pathQuery(path), nil, hdr))
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func etagOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return `"` + hex.EncodeToString(sum[:]) + `"`
}

func wantErr(t *testing.T, a apitest.Answer, status int, code, reason string) {
	t.Helper()
	if a.Status != status || a.Code() != code || (reason != "" && a.Reason() != reason) {
		t.Fatalf("got %d %s/%s, want %d %s/%s: %s", a.Status, a.Code(), a.Reason(), status, code, reason, a.Raw)
	}
}

// usage is the project's quota row and what storage_objects says it must be.
type usage struct {
	usedBytes, usedObjects, reservedBytes, reservedObjects int64
	sumBytes, count                                        int64
}

func (w *world) usage(t *testing.T, project string) usage {
	t.Helper()
	var u usage
	err := w.env.Pool.QueryRow(context.Background(), `
		SELECT coalesce(q.used_bytes, 0), coalesce(q.used_objects, 0), coalesce(q.reserved_bytes, 0), coalesce(q.reserved_objects, 0),
		       (SELECT coalesce(sum(size_bytes), 0) FROM storage_objects WHERE project_id = $1),
		       (SELECT count(*) FROM storage_objects WHERE project_id = $1)
		FROM (SELECT $1::uuid AS project_id) p LEFT JOIN storage_quotas q ON q.project_id = p.project_id`, project).
		Scan(&u.usedBytes, &u.usedObjects, &u.reservedBytes, &u.reservedObjects, &u.sumBytes, &u.count)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// exact fails unless usage equals the stored objects and nothing is reserved.
func (u usage) exact(t *testing.T) {
	t.Helper()
	if u.usedBytes != u.sumBytes || u.usedObjects != u.count || u.reservedBytes != 0 || u.reservedObjects != 0 {
		t.Fatalf("quota %+v does not match the stored objects", u)
	}
}

// waitSettled polls until the project's reservations are gone (the server has noticed
// an interrupted upload); the bound only stops a broken server from hanging the test.
func (w *world) waitSettled(t *testing.T, project string) usage {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		u := w.usage(t, project)
		if u.reservedBytes == 0 && u.reservedObjects == 0 && w.env.Count(t, `SELECT count(*) FROM storage_uploads`) == 0 {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservation never freed: %+v", u)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// files lists every file under dir (relative), for "nothing left behind".
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

// rawPut writes a PUT head and then body to a raw TCP connection and returns it with a
// reader of the answers.
func (w *world) rawPut(t *testing.T, path string, head string, body []byte) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", w.env.Server.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	req := "PUT /api/v1/storage/buckets/" + w.bucket + "/object?" + pathQuery(path) + " HTTP/1.1\r\n" +
		"Host: test\r\nAuthorization: Bearer " + w.token + "\r\nX-Project-ID: " + w.project + "\r\n" + head + "\r\n"
	if _, err := conn.Write(append([]byte(req), body...)); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

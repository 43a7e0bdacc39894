package e2e_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
)

// TestCLIStorage drives the built `gantry` binary through the storage commands against a
// real control plane: bucket create and ls, a 5 MiB upload, ls of a folder and of the
// bucket, a download compared by SHA-256 (to a file, into a directory and to stdout), a
// missing object (exit 5 with the API code and correlation id), rm refused while the
// bucket holds objects, quota showing the bytes, rm --force; a local-to-local cp is a
// usage error.
func TestCLIStorage(t *testing.T) {
	c := startCP(t)
	c.runBackground(c.app)
	tenant := c.env.NewTenant(t, c.admin, "CLI Storage")
	u := newCLIUser(t, c.url)
	if _, errOut, code := u.run(apitest.Password+"\n", "login", "-u", tenant.AdminUsername, "--password-stdin"); code != 0 {
		t.Fatalf("login: exit %d\n%s", code, errOut)
	}

	u.ok("bucket", "create", "data")
	var buckets []api.StorageBucket
	if err := json.Unmarshal([]byte(u.ok("bucket", "ls", "-o", "json")), &buckets); err != nil || len(buckets) != 1 || buckets[0].BucketID != "data" {
		t.Fatalf("bucket ls: %v %+v", err, buckets)
	}
	if out := u.ok("bucket", "ls"); !strings.Contains(out, "BUCKET") || !strings.Contains(out, "data") {
		t.Fatalf("bucket ls table:\n%s", out)
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "weights.bin")
	payload := make([]byte, 5<<20+123)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(payload)
	if _, errOut, code := u.run("", "cp", src, "bucket:data/models/run-1/weights.bin"); code != 0 || !strings.Contains(errOut, "Uploaded") {
		t.Fatalf("cp up: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := u.run("small text\n", "cp", "-", "bucket:data/readme.txt"); code != 0 {
		t.Fatalf("cp stdin up: exit %d\n%s", code, errOut)
	}

	var top, folder struct {
		Prefixes []string            `json:"prefixes"`
		Objects  []api.StorageObject `json:"objects"`
	}
	if err := json.Unmarshal([]byte(u.ok("ls", "data", "-o", "json")), &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Prefixes) != 1 || top.Prefixes[0] != "models/" || len(top.Objects) != 1 || top.Objects[0].Path != "readme.txt" {
		t.Fatalf("ls data: %+v", top)
	}
	if err := json.Unmarshal([]byte(u.ok("ls", "bucket:data/models/run-1/", "-o", "json")), &folder); err != nil {
		t.Fatal(err)
	}
	if len(folder.Objects) != 1 || folder.Objects[0].SizeBytes != int64(len(payload)) {
		t.Fatalf("ls folder: %+v", folder)
	}
	if out := u.ok("ls", "data/models/run-1/"); !strings.Contains(out, "models/run-1/weights.bin") {
		t.Fatalf("ls table:\n%s", out)
	}

	// Down to a named file, into a directory, and to stdout: the same bytes each time.
	dst := filepath.Join(dir, "back.bin")
	u.ok("cp", "bucket:data/models/run-1/weights.bin", dst)
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	u.ok("cp", "bucket:data/models/run-1/weights.bin", sub)
	for _, p := range []string{dst, filepath.Join(sub, "weights.bin")} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil || [32]byte(h.Sum(nil)) != want {
			t.Fatalf("%s: sha256 differs from the upload (%v)", p, err)
		}
	}
	if got := sha256.Sum256([]byte(u.ok("cp", "bucket:data/models/run-1/weights.bin", "-"))); got != want {
		t.Fatal("cp to stdout: sha256 differs from the upload")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Fatalf("temporary files left beside the targets: %v", entries)
	}
	u.fails(5, "storage_object_not_found", "cp", "bucket:data/missing.bin", filepath.Join(dir, "missing.bin"))
	if _, err := os.Stat(filepath.Join(dir, "missing.bin")); !os.IsNotExist(err) {
		t.Fatalf("a failed download left a file: %v", err)
	}
	u.fails(2, "", "cp", src, filepath.Join(dir, "x"))

	// rm is refused while the bucket holds objects; nothing is deleted.
	if errOut := u.fails(6, "invalid_request", "bucket", "rm", "data"); !strings.Contains(errOut, "bucket_not_empty") {
		t.Fatalf("rm of a non-empty bucket:\n%s", errOut)
	}

	var q api.StorageQuota
	if err := json.Unmarshal([]byte(u.ok("quota", "-o", "json")), &q); err != nil {
		t.Fatal(err)
	}
	wantBytes := int64(len(payload) + len("small text\n"))
	if q.UsedBytes != wantBytes || q.UsedObjects != 2 {
		t.Fatalf("quota: used %d bytes %d objects, want %d and 2", q.UsedBytes, q.UsedObjects, wantBytes)
	}
	if out := u.ok("quota"); !strings.Contains(out, "Used bytes") || !strings.Contains(out, fmt.Sprint(wantBytes)) {
		t.Fatalf("quota table:\n%s", out)
	}

	u.ok("bucket", "rm", "data", "--force")
}

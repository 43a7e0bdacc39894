package instances_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/artifacts"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// newArtifact stores an artifact of the field's project with one file.
func (f *field) newArtifact(t *testing.T, name, path string, body []byte) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	a, err := f.env.App.Artifacts.Create(ctx, f.proj, f.caller.UserID, artifacts.NewArtifact{Name: name, Version: "1", Kind: "model"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.env.App.Artifacts.PutFile(ctx, f.proj.ID, a.ID, path, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	return a.ID
}

// An app instance's artifacts reach the node through the control plane over the fabric
// and are placed read-only in the instance's directory before the app starts: the app
// serves the artifact's bytes. An artifact whose stored bytes were tampered with, and
// one whose file changed after the start pinned its digest, fail the instance with
// artifact_digest_mismatch, and the app never runs.
func TestArtifactsWithARealAgent(t *testing.T) {
	t.Parallel()
	py := python(t)
	f := newField(t, instances.Config{}, map[string]instances.Version{"files@1": {AppSlug: "files", AppName: "Files", Kind: "app", Version: "1",
		Command: []string{py, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{artifacts_dir}"},
		Health:  instances.HealthCheck{Type: "http", Path: "/", IntervalSeconds: 1}, MinGPUs: 1}})
	f.startAgent(t)
	f.provision(t)
	ctx := principal.With(context.Background(), f.caller)
	launch := func(ids ...uuid.UUID) instances.Instance {
		t.Helper()
		i, err := f.svc.Launch(ctx, f.caller, f.proj, instances.LaunchSpec{Name: "files", AppSlug: "files", Version: "1",
			AllocationID: uuid.NullUUID{UUID: f.allocID, Valid: true}, ArtifactIDs: ids})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		return i
	}

	weights := bytes.Repeat([]byte("gantry-weights-"), 100_000) // 1.5 MB: more than one 1 MiB chunk
	okID := f.newArtifact(t, "weights", "layers/w.bin", weights)
	i := launch(okID)
	f.until(t, i.ID, lifecycle.Running)
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(i.Port) + "/weights/layers/w.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, weights) {
		t.Fatalf("the app served %d, %d bytes; want the artifact's %d bytes", resp.StatusCode, len(got), len(weights))
	}
	// Read-only on the node.
	var placed string
	suffix := filepath.Join(".gantry", "apps", i.ID.String(), apptask.ArtifactsDir, "weights", "layers", "w.bin")
	_ = filepath.WalkDir(f.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, suffix) {
			placed = p
		}
		return nil
	})
	if placed == "" {
		t.Fatal("the artifact file is not in the instance's directory")
	}
	for p, want := range map[string]os.FileMode{placed: 0o444, filepath.Dir(placed): 0o555, filepath.Dir(filepath.Dir(placed)): 0o555} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %v", p, fi.Mode(), err, want)
		}
	}
	if _, err := f.svc.Stop(ctx, f.caller, f.proj, i.ID); err != nil {
		t.Fatal(err)
	}
	f.until(t, i.ID, lifecycle.Stopped)

	// The stored bytes tampered with (same length): the control plane's read refuses
	// them, the agent fails the start.
	tamperedID := f.newArtifact(t, "tampered", "w.bin", weights)
	var key string
	if err := f.env.Pool.QueryRow(context.Background(), `SELECT blob_key FROM app_artifact_files WHERE artifact_id = $1`, tamperedID).Scan(&key); err != nil {
		t.Fatal(err)
	}
	evil := bytes.Clone(weights)
	evil[len(evil)/2] ^= 0xff
	if _, err := f.env.App.Blob.Put(context.Background(), key, bytes.NewReader(evil), int64(len(evil))); err != nil {
		t.Fatal(err)
	}
	j := launch(tamperedID)
	failed := f.until(t, j.ID, lifecycle.Failed)
	if failed.StateReason == nil || !strings.Contains(*failed.StateReason, apptask.ReasonArtifactDigestMismatch) {
		t.Fatalf("tampered: reason %v", failed.StateReason)
	}

	// Bytes and recorded digest both changed after the start task pinned the digest
	// (the store and the database tampered with together): the control plane's check
	// passes, the agent's own check against the pin refuses them.
	replacedID := f.newArtifact(t, "replaced", "w.bin", weights)
	k := launch(replacedID) // app.start (with the pinned digest) is enqueued now, delivered by the reconcile pass
	if err := f.env.Pool.QueryRow(context.Background(), `SELECT blob_key FROM app_artifact_files WHERE artifact_id = $1`, replacedID).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if _, err := f.env.App.Blob.Put(context.Background(), key, bytes.NewReader(evil), int64(len(evil))); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(evil)
	if _, err := f.env.Pool.Exec(context.Background(), `UPDATE app_artifact_files SET sha256 = $2 WHERE artifact_id = $1`, replacedID, hex.EncodeToString(sum[:])); err != nil {
		t.Fatal(err)
	}
	failed = f.until(t, k.ID, lifecycle.Failed)
	if failed.StateReason == nil || !strings.Contains(*failed.StateReason, apptask.ReasonArtifactDigestMismatch) || !strings.Contains(*failed.StateReason, "pinned") {
		t.Fatalf("replaced: reason %v", failed.StateReason)
	}
}

// A launch that names artifacts it may not mount is refused before anything is written:
// another project's artifact, one that does not exist, two of one name, one twice, more
// than 16, more than 1000 files in all.
func TestLaunchArtifactRefusalsPersistNothing(t *testing.T) {
	t.Parallel()
	f := newField(t, instances.Config{}, map[string]instances.Version{"files@1": {AppSlug: "files", AppName: "Files", Kind: "app", Version: "1",
		Command: []string{"/bin/true"}, MinGPUs: 1}})
	ctx := principal.With(context.Background(), f.caller)
	own := f.newArtifact(t, "dup", "a.txt", []byte("a"))
	a2, err := f.env.App.Artifacts.Create(context.Background(), f.proj, f.caller.UserID, artifacts.NewArtifact{Name: "dup", Version: "2", Kind: "config"})
	if err != nil {
		t.Fatal(err)
	}
	other := f.proj
	other.ID = uuid.Must(uuid.NewV7())
	foreign, err := f.env.App.Artifacts.Create(context.Background(), other, f.caller.UserID, artifacts.NewArtifact{Name: "theirs", Version: "1", Kind: "config"})
	if err != nil {
		t.Fatal(err)
	}
	many, err := f.env.App.Artifacts.Create(context.Background(), f.proj, f.caller.UserID, artifacts.NewArtifact{Name: "many", Version: "1", Kind: "dataset"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.env.Pool.Exec(context.Background(), `INSERT INTO app_artifact_files (artifact_id, path, size_bytes, sha256, blob_key, created_at)
		SELECT $1::uuid, 'f' || g, 0, repeat('0', 64), 'test/' || $1::text || '/' || g, now() FROM generate_series(1, 1001) g`, many.ID); err != nil {
		t.Fatal(err)
	}
	seventeen := make([]uuid.UUID, 17)
	for i := range seventeen {
		seventeen[i] = own
	}
	for _, c := range []struct {
		name   string
		ids    []uuid.UUID
		reason string
	}{
		{"another project's", []uuid.UUID{foreign.ID}, "artifact_not_found"},
		{"missing", []uuid.UUID{uuid.Must(uuid.NewV7())}, "artifact_not_found"},
		{"two of one name", []uuid.UUID{own, a2.ID}, "duplicate_artifact_name"},
		{"one twice", []uuid.UUID{own, own}, "duplicate_artifact_id"},
		{"seventeen", seventeen, "too_many"},
		{"1001 files", []uuid.UUID{many.ID}, "too_many_files"},
	} {
		_, err := f.svc.Launch(ctx, f.caller, f.proj, instances.LaunchSpec{Name: "files", AppSlug: "files", Version: "1",
			AllocationID: uuid.NullUUID{UUID: f.allocID, Valid: true}, ArtifactIDs: c.ids})
		e, ok := apierr.As(err)
		if !ok || e.Code != apierr.ValidationError || e.Details["reason"] != c.reason {
			t.Errorf("%s: %v, want validation_error %s", c.name, err, c.reason)
		}
	}
	var n int
	if err := f.env.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM app_instances WHERE project_id = $1)
		+ (SELECT count(*) FROM app_instance_tasks t JOIN app_instances i ON i.id = t.instance_id WHERE i.project_id = $1)`, f.proj.ID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d instance and task rows after refusals", n)
	}
}

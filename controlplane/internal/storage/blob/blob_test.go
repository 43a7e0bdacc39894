package blob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/minio/minio-go/v7"

	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob/blobtest"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob/s3test"
)

func TestMain(m *testing.M) { s3test.Main(m) }

func newFS(t *testing.T) *blob.FS {
	t.Helper()
	d, err := blob.NewFS(filepath.Join(t.TempDir(), "storage"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestFSConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Driver { return newFS(t) })
}

func TestS3Conformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Driver { return s3test.NewDriver(t) })
}

func TestKey(t *testing.T) {
	ten, proj, bkt, ver := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	k := blob.Key(ten, proj, bkt, ver)
	want := "t/" + ten.String() + "/p/" + proj.String() + "/b/" + bkt.String() + "/" + ver.String()
	if k != want || !blob.ValidKey(k) {
		t.Fatalf("Key = %q (valid %v), want %q", k, blob.ValidKey(k), want)
	}
	if p := blob.BucketPrefix(ten, proj, bkt); !strings.HasPrefix(k, p) || !strings.HasSuffix(p, "/") {
		t.Fatalf("BucketPrefix %q is not the prefix of %q", p, k)
	}
	if blob.ValidKey(strings.Repeat("a", 513)) || !blob.ValidKey(strings.Repeat("a", 512)) {
		t.Fatal("ValidKey length limit is not 512")
	}
}

// outside is a directory beside the fs root with one file in it, and a check that both are
// untouched.
func outside(t *testing.T) (dir string, unchanged func()) {
	t.Helper()
	dir = t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, func() {
		t.Helper()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "secret" {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Fatalf("the directory outside the root now holds %q", names)
		}
		if b, err := os.ReadFile(secret); err != nil || string(b) != "outside" {
			t.Fatalf("the file outside the root changed: %q, %v", b, err)
		}
	}
}

// TestFSPlantedSymlink plants links to a directory outside the root at every level of a
// key, and a link named like the key itself to a file outside: no operation may read,
// write, create or delete anything outside.
func TestFSPlantedSymlink(t *testing.T) {
	ctx := context.Background()
	ten, proj, bkt := uuid.New(), uuid.New(), uuid.New()
	key := blob.Key(ten, proj, bkt, uuid.New())
	parts := strings.Split(key, "/")
	for level := 1; level < len(parts); level++ {
		t.Run(strings.Join(parts[:level], "/"), func(t *testing.T) {
			d := newFS(t)
			out, unchanged := outside(t)
			link := filepath.Join(d.Dir(), filepath.FromSlash(strings.Join(parts[:level], "/")))
			if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(out, link); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Put(ctx, key, blob.Pattern(100, 1), 100); err == nil {
				t.Fatal("Put through a link out of the root succeeded")
			}
			if _, err := d.Put(ctx, key, blob.Pattern(100, 1), -1); err == nil {
				t.Fatal("Put(-1) through a link out of the root succeeded")
			}
			// The same name as the file outside: a followed link would reach it.
			viaLink := strings.Join(parts[:level], "/") + "/secret"
			if blob.ValidKey(viaLink) {
				if rc, err := d.Open(ctx, viaLink, 0, -1); err == nil {
					b, _ := io.ReadAll(rc)
					rc.Close()
					t.Fatalf("Open through a link out of the root read %q", b)
				}
				if _, err := d.Stat(ctx, viaLink); err == nil {
					t.Fatal("Stat through a link out of the root succeeded")
				}
				if err := d.Delete(ctx, viaLink); err == nil {
					t.Fatal("Delete through a link out of the root reported success")
				}
				if _, err := d.Put(ctx, viaLink, blob.Pattern(5, 1), 5); err == nil {
					t.Fatal("Put over a file out of the root succeeded")
				}
			}
			if err := d.Delete(ctx, key); err == nil {
				t.Fatal("Delete through a link out of the root reported success")
			}
			if n, err := d.RemoveStaleTemps(ctx, time.Now().Add(time.Hour)); err != nil || n != 0 {
				t.Fatalf("RemoveStaleTemps = %d, %v", n, err)
			}
			unchanged()
		})
	}
	t.Run("the key itself", func(t *testing.T) {
		d := newFS(t)
		out, unchanged := outside(t)
		link := filepath.Join(d.Dir(), filepath.FromSlash(key))
		if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(out, "secret"), link); err != nil {
			t.Fatal(err)
		}
		if rc, err := d.Open(ctx, key, 0, -1); err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			t.Fatalf("Open of a link out of the root read %q", b)
		}
		if _, err := d.Stat(ctx, key); err == nil {
			t.Fatal("Stat of a link out of the root succeeded")
		}
		// Put replaces the link itself (rename does not follow it): the file outside
		// keeps its bytes.
		if _, err := d.Put(ctx, key, blob.Pattern(100, 1), 100); err != nil {
			t.Fatal(err)
		}
		if n, err := blob.Drain(ctx, d, key); err != nil || n != 100 {
			t.Fatalf("Drain after replacing the link = %d, %v", n, err)
		}
		// Delete removes the name in the root, never the target.
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(out, "secret"), link); err != nil {
			t.Fatal(err)
		}
		if err := d.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the link is still there: %v", err)
		}
		unchanged()
	})
}

// TestFSTempFiles: a Put in progress is a temp file beside the key that is neither the
// object nor visible through the driver; a failure removes it; RemoveStaleTemps removes
// what a crash would leave and nothing else.
func TestFSTempFiles(t *testing.T) {
	ctx := context.Background()
	d := newFS(t)
	key := blob.Key(uuid.New(), uuid.New(), uuid.New(), uuid.New())
	dir := filepath.Join(d.Dir(), filepath.FromSlash(key), "..")

	// While the reader blocks, the object is not visible and exactly one temp file exists.
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := d.Put(ctx, key, pr, 2000)
		done <- err
	}()
	if _, err := pw.Write(bytes.Repeat([]byte("x"), 1000)); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !strings.HasPrefix(entries[0].Name(), ".put-") {
		t.Fatalf("during the Put the key's directory holds %v", entries)
	}
	if _, err := d.Stat(ctx, key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat during the Put = %v, want ErrNotFound", err)
	}
	pw.CloseWithError(errors.New("client went away"))
	if err := <-done; err == nil {
		t.Fatal("Put of a failed stream succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("after the failed Put the directory holds %v", entries)
	}

	// A crash's leftovers: an old temp file goes, a fresh one and the objects stay.
	put := func(k string) {
		if _, err := blob.PutPattern(ctx, d, k, 10, 1); err != nil {
			t.Fatal(err)
		}
	}
	put(key)
	stale := filepath.Join(dir, ".put-stale")
	fresh := filepath.Join(dir, ".put-fresh")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	if err := os.Chtimes(stale, now.Add(-48*time.Hour), now.Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	n, err := d.RemoveStaleTemps(ctx, now.Add(-24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("RemoveStaleTemps = %d, %v; want 1", n, err)
	}
	inv, err := d.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{key, filepath.ToSlash(filepath.Join(filepath.Dir(filepath.FromSlash(key)), ".put-fresh"))}
	slices.Sort(want)
	if !slices.Equal(inv, want) {
		t.Fatalf("after RemoveStaleTemps the root holds %q, want %q", inv, want)
	}
}

// TestFSPutStreams: a 64 MiB Put allocates a small fraction of the object, because it
// streams through one pooled buffer (allocation, not timing, is measured).
func TestFSPutStreams(t *testing.T) {
	ctx := context.Background()
	d := newFS(t)
	key := blob.Key(uuid.New(), uuid.New(), uuid.New(), uuid.New())
	const n = 64 << 20
	// Warm the pool so its one buffer is not counted.
	if _, err := blob.PutPattern(ctx, d, key, 10, 1); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := blob.PutPattern(ctx, d, key, n, 1); err != nil {
		t.Fatal(err)
	}
	if got, err := blob.Drain(ctx, d, key); err != nil || got != n {
		t.Fatalf("Drain = %d, %v", got, err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Fatalf("a 64 MiB Put and read allocated %d bytes; the object was buffered", alloc)
	}
}

func TestConfigOpen(t *testing.T) {
	t.Setenv("GANTRY_STORAGE_DRIVER", "")
	t.Setenv("GANTRY_STORAGE_FS_ROOT", filepath.Join(t.TempDir(), "root"))
	cfg, err := blob.LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	d, err := blob.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name() != "fs" {
		t.Fatalf("default driver %q, want fs", d.Name())
	}
	d.Close()

	t.Setenv("GANTRY_STORAGE_DRIVER", "s3")
	t.Setenv("GANTRY_STORAGE_S3_ENDPOINT", "http://127.0.0.1:9")
	t.Setenv("GANTRY_STORAGE_S3_BUCKET", "b")
	t.Setenv("GANTRY_STORAGE_S3_ACCESS_KEY", "k")
	t.Setenv("GANTRY_STORAGE_S3_SECRET_KEY", "s")
	t.Setenv("GANTRY_STORAGE_S3_INSECURE", "true")
	cfg, err = blob.LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.S3.Endpoint != "http://127.0.0.1:9" || cfg.S3.Bucket != "b" || !cfg.S3.Insecure || cfg.S3.AccessKey != "k" {
		t.Fatalf("S3 config not read: %+v", cfg.S3)
	}
	d, err = blob.Open(cfg)
	if err != nil || d.Name() != "s3" {
		t.Fatalf("Open s3 = %v, %v", d, err)
	}
	// Nothing listens on port 9: the driver reports the failure, it does not invent an answer.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := d.Stat(ctx, "a"); err == nil || errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat against no server = %v, want a connection error", err)
	}

	for _, bad := range []blob.Config{
		{Driver: "nfs"},
		{Driver: "s3"},
		{Driver: "s3", S3: blob.S3Config{Endpoint: "ftp://x", Bucket: "b"}},
		{Driver: "s3", S3: blob.S3Config{Endpoint: "https://x/path", Bucket: "b"}},
	} {
		if d, err := blob.Open(bad); err == nil {
			d.Close()
			t.Errorf("Open(%+v) succeeded", bad)
		}
	}
}

// TestS3InventorySeesUnfinishedUploads: the suite's "nothing left behind" checks rely on
// Inventory listing unfinished multipart uploads, so check that it does.
func TestS3InventorySeesUnfinishedUploads(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Shared(t)
	bucket := srv.NewBucket(t)
	d, err := blob.NewS3(srv.Config(bucket))
	if err != nil {
		t.Fatal(err)
	}
	key := blob.Key(uuid.New(), uuid.New(), uuid.New(), uuid.New())
	core := minio.Core{Client: srv.Client()}
	if _, err := core.NewMultipartUpload(ctx, bucket, key, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	inv, err := d.Inventory(ctx)
	if err != nil || !slices.Equal(inv, []string{"upload:" + key}) {
		t.Fatalf("Inventory = %q, %v; want the unfinished upload", inv, err)
	}
}

// benchSize is what one benchmark iteration streams: the 1 GiB object.
const benchSize = 1 << 30

// BenchmarkFSPut streams benchSize bytes into the fs driver (hashing, fsync, rename): the
// write baseline the storage benchmark compares an API PUT against.
func BenchmarkFSPut(b *testing.B) {
	d, err := blob.NewFS(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	key := blob.Key(uuid.New(), uuid.New(), uuid.New(), uuid.New())
	b.SetBytes(benchSize)
	for b.Loop() {
		if _, err := blob.PutPattern(context.Background(), d, key, benchSize, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFSOpen reads benchSize bytes back: the read baseline.
func BenchmarkFSOpen(b *testing.B) {
	d, err := blob.NewFS(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	key := blob.Key(uuid.New(), uuid.New(), uuid.New(), uuid.New())
	if _, err := blob.PutPattern(context.Background(), d, key, benchSize, 1); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchSize)
	for b.Loop() {
		if n, err := blob.Drain(context.Background(), d, key); err != nil || n != benchSize {
			b.Fatal(n, err)
		}
	}
}

package storagemount

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	agentrt "github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/testenv/ci"
)

const (
	allocID = "0190f6a0-0000-7000-8000-00000000a001"
	attRW   = "0190f6a0-0000-7000-8000-00000000b001"
	attRO   = "0190f6a0-0000-7000-8000-00000000b002"
)

// env is one node: a real process runtime with a provisioned allocation, a storage
// manager, and the control plane's StorageFabric (test double) behind a real gRPC
// connection.
type env struct {
	t     testing.TB
	store *memStore
	conns *Conns
	rt    *agentrt.Runtime
	mgr   *Manager
	state string
	home  string
	mode  string
	sync  time.Duration // the managers' SyncInterval (0: default)
}

func requireFUSE(t *testing.T) {
	t.Helper()
	if !fuseUsable("/dev/fuse") {
		ci.Missing(t, "/dev/fuse is not usable here (no FUSE device, or not permitted)")
	}
}

func newEnv(t *testing.T, mode string) *env { return newTBEnv(t, mode, viaRaw) }

// newEnvVia is newEnv with the agent reaching the server via viaRaw, viaGRPC or
// viaOldCP (raw_test.go).
func newEnvVia(t *testing.T, mode, via string) *env { return newTBEnv(t, mode, via) }

func newBenchEnv(b *testing.B, via string) *env { return newTBEnv(b, ModeFUSE, via) }

func newTBEnv(t testing.TB, mode, via string) *env {
	t.Helper()
	e := &env{t: t, store: newMemStore(), conns: NewConns(), state: t.TempDir(), mode: mode}
	e.store.attachments[attRW] = true
	e.store.attachments[attRO] = false
	if via == viaGRPC {
		e.conns.Set(e.store.serve(t))
	} else {
		e.conns.SetTunnel(e.store.serveTunnel(t, via == viaRaw))
	}
	backend, err := gpu.Open(gpu.BackendMockH100, gpu.Options{MockSeed: "storagemount-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	e.rt, err = agentrt.New(agentrt.Options{
		Driver: &agentrt.Process{Root: filepath.Join(e.state, "allocations")}, StateDir: e.state,
		Inventory: backend, AdvertiseHost: "gpu-test-01",
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Provision(context.Background(), alloctask.Payload{AllocationID: allocID, User: alloctask.UserName(allocID)}); err != nil {
		t.Fatal(err)
	}
	s, ok := e.rt.Session(allocID)
	if !ok {
		t.Fatal("allocation not active")
	}
	e.home = s.Dir
	e.mgr = e.newManager()
	t.Cleanup(e.mgr.Close)
	return e
}

func (e *env) newManager() *Manager {
	c := NewClient(e.conns)
	c.RetryFor, c.Backoff = 10*time.Second, 10*time.Millisecond
	m, err := New(Options{StateDir: e.state, Client: c, Accounts: e.rt, Mode: e.mode, SyncInterval: e.sync, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

func payload(att, mode string) alloctask.StoragePayload {
	return alloctask.StoragePayload{AllocationID: allocID, User: alloctask.UserName(allocID), AttachmentID: att, BucketID: "datasets", Mode: mode}
}

// task runs a storage task through the manager's executor, as the agent does.
func (e *env) task(kind string, p alloctask.StoragePayload) (tasks.Result, alloctask.StorageResult) {
	e.t.Helper()
	body, _ := json.Marshal(p)
	r := e.mgr.Execute(context.Background(), tasks.Task{ID: "t", Kind: kind, Payload: body, ContentType: alloctask.ContentType})
	var res alloctask.StorageResult
	if err := json.Unmarshal(r.Output, &res); err != nil {
		e.t.Fatalf("result output %q: %v", r.Output, err)
	}
	return r, res
}

func (e *env) attach(p alloctask.StoragePayload) string {
	e.t.Helper()
	r, res := e.task(alloctask.KindStorageAttach, p)
	if r.Status != tasks.Succeeded {
		e.t.Fatalf("attach: %s %s", r.ErrorCode, r.ErrorMessage)
	}
	want := alloctask.StorageMethodCopy
	if e.mode == ModeFUSE {
		want = alloctask.StorageMethodFUSE
	}
	if res.Method != want {
		e.t.Fatalf("method %q, want %q", res.Method, want)
	}
	if res.MountPath != filepath.Join(e.home, "buckets", p.BucketID) {
		e.t.Fatalf("mount path %q, home %q", res.MountPath, e.home)
	}
	return res.MountPath
}

func isMounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func seed(s *memStore) {
	s.put("readme.txt", []byte("hello from the bucket\n"))
	s.put("data/a.csv", []byte("x,y\n1,2\n"))
	s.put("data/sub/b.bin", bytes.Repeat([]byte{7}, 300_000))
}

func names(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() {
			n += "/"
		}
		out = append(out, n)
	}
	return strings.Join(out, " ")
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFUSEReadWriteDelete: a rw FUSE attachment shows the bucket's objects as files and
// "/" as folders, with the allocation user's ownership; a file written in the mount
// arrives in the bucket when closed, an overwrite replaces the object, rm deletes it,
// mkdir is virtual; a redelivered attach finds the mount; detach unmounts and leaves
// the bucket as it is.
func TestFUSEReadWriteDelete(t *testing.T) {
	requireFUSE(t)
	e := newEnv(t, ModeFUSE)
	seed(e.store)
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	if !isMounted(t, dir) {
		t.Fatalf("%s is not a mount point", dir)
	}
	if got := names(t, dir); got != "data/ readme.txt" {
		t.Fatalf("root lists %q", got)
	}
	if got := names(t, filepath.Join(dir, "data")); got != "a.csv sub/" {
		t.Fatalf("data/ lists %q", got)
	}
	if got := readFile(t, filepath.Join(dir, "readme.txt")); got != "hello from the bucket\n" {
		t.Fatalf("readme %q", got)
	}
	if got := readFile(t, filepath.Join(dir, "data/sub/b.bin")); got != strings.Repeat("\x07", 300_000) {
		t.Fatalf("b.bin: %d bytes", len(got))
	}
	st, err := os.Stat(filepath.Join(dir, "data/a.csv"))
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if st.Mode().Perm() != 0o644 || int(sys.Uid) != os.Getuid() || st.Size() != 8 {
		t.Fatalf("a.csv: mode %v uid %d size %d", st.Mode(), sys.Uid, st.Size())
	}

	// A new file in a new folder arrives on close.
	if err := os.MkdirAll(filepath.Join(dir, "out/run1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "out/run1/ckpt.txt"), []byte("epoch 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, ok := e.store.get("out/run1/ckpt.txt"); !ok || string(got) != "epoch 1" {
		t.Fatalf("uploaded %q %v", got, ok)
	}
	// Overwrite, append.
	if err := os.WriteFile(filepath.Join(dir, "readme.txt"), []byte("replaced"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "data/a.csv"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("3,4\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.store.get("readme.txt"); string(got) != "replaced" {
		t.Fatalf("readme in bucket %q", got)
	}
	if got, _ := e.store.get("data/a.csv"); string(got) != "x,y\n1,2\n3,4\n" {
		t.Fatalf("a.csv in bucket %q", got)
	}
	if got := readFile(t, filepath.Join(dir, "data/a.csv")); got != "x,y\n1,2\n3,4\n" {
		t.Fatalf("a.csv read back %q", got)
	}
	// rm deletes the object; rename is refused with EXDEV (mv copies instead).
	if err := os.Remove(filepath.Join(dir, "data/sub/b.bin")); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.store.get("data/sub/b.bin"); ok {
		t.Fatal("b.bin still in the bucket")
	}
	if err := os.Rename(filepath.Join(dir, "readme.txt"), filepath.Join(dir, "r2")); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := names(t, dir); got != "data/ empty/ out/ readme.txt" {
		t.Fatalf("root lists %q", got)
	}
	if err := os.Remove(filepath.Join(dir, "empty")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "out")); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("rmdir of a folder with objects: %v", err)
	}

	// Redelivered attach: same mount, nothing mounted twice.
	if again := e.attach(payload(attRW, alloctask.StorageModeRW)); again != dir || len(e.mgr.List()) != 1 {
		t.Fatalf("redelivered attach: %q, %d held", again, len(e.mgr.List()))
	}

	r, res := e.task(alloctask.KindStorageDetach, payload(attRW, alloctask.StorageModeRW))
	if r.Status != tasks.Succeeded || res.Method != alloctask.StorageMethodFUSE {
		t.Fatalf("detach: %+v %+v", r, res)
	}
	if isMounted(t, dir) {
		t.Fatal("still mounted after detach")
	}
	if got := names(t, dir); got != "" {
		t.Fatalf("mount point holds %q after detach", got)
	}
	if got := strings.Join(e.store.paths(), " "); got != "data/a.csv out/run1/ckpt.txt readme.txt" {
		t.Fatalf("bucket after detach: %q", got)
	}
	// Detaching again (redelivery) succeeds and does nothing.
	if r, _ := e.task(alloctask.KindStorageDetach, payload(attRW, alloctask.StorageModeRW)); r.Status != tasks.Succeeded {
		t.Fatalf("second detach: %+v", r)
	}
}

// TestFUSEReadOnlyRefusesWrites: a ro mount reads, and refuses every change with EROFS
// (even for root, whom the kernel's permission check would let through).
func TestFUSEReadOnlyRefusesWrites(t *testing.T) {
	requireFUSE(t)
	e := newEnv(t, ModeFUSE)
	seed(e.store)
	p := payload(attRO, alloctask.StorageModeRO)
	dir := e.attach(p)
	if got := readFile(t, filepath.Join(dir, "data/a.csv")); got != "x,y\n1,2\n" {
		t.Fatalf("read %q", got)
	}
	st, err := os.Stat(filepath.Join(dir, "readme.txt"))
	if err != nil || st.Mode().Perm() != 0o444 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(dir, &sfs); err != nil || sfs.Bavail == 0 {
		t.Fatalf("statfs: %v, %d blocks available", err, sfs.Bavail)
	}
	for what, err := range map[string]error{
		"overwrite": os.WriteFile(filepath.Join(dir, "readme.txt"), []byte("x"), 0o644),
		"create":    os.WriteFile(filepath.Join(dir, "new.txt"), []byte("x"), 0o644),
		"remove":    os.Remove(filepath.Join(dir, "readme.txt")),
		"mkdir":     os.Mkdir(filepath.Join(dir, "d"), 0o755),
		"truncate":  os.Truncate(filepath.Join(dir, "readme.txt"), 0),
	} {
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s: %v, want EROFS", what, err)
		}
	}
	if got := strings.Join(e.store.paths(), " "); got != "data/a.csv data/sub/b.bin readme.txt" || e.store.writes != 0 {
		t.Fatalf("bucket changed: %q, %d writes", got, e.store.writes)
	}
}

// peakHeap samples the heap while f runs and returns the largest growth seen.
func peakHeap(f func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapInuse)
			}
		}
	}()
	f()
	close(done)
	<-stopped
	if peak < base {
		return 0
	}
	return peak - base
}

const largeSize = 64 << 20

// TestFUSELargeFileStreamed: a 64 MiB object read through the mount arrives intact
// (hash = etag) while the agent asks for bounded prefetch blocks, never more of them
// at once than PrefetchBlocks (plus one a read may straddle), and never holds the
// object in memory; a stream broken mid-object (the tunnel dropped) is resumed where
// it stopped, from the same version.
func TestFUSELargeFileStreamed(t *testing.T) {
	requireFUSE(t)
	e := newEnv(t, ModeFUSE)
	etag := e.store.putSynthetic("big.bin", largeSize)
	e.store.breakReads = 2
	dir := e.attach(payload(attRO, alloctask.StorageModeRO))
	var sum string
	var n int64
	grew := peakHeap(func() {
		f, err := os.Open(filepath.Join(dir, "big.bin"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		h := sha256.New()
		n, err = io.Copy(h, f)
		if err != nil {
			t.Fatal(err)
		}
		sum = `"` + hex.EncodeToString(h.Sum(nil)) + `"`
	})
	if n != largeSize || sum != etag {
		t.Fatalf("read %d bytes, hash %s, want %s", n, sum, etag)
	}
	e.store.mu.Lock()
	reads := append([]readReq(nil), e.store.reads...)
	e.store.mu.Unlock()
	// Blocks grow 1, 2, 4 MiB and stay at PrefetchBlock: 64 MiB in about 18 streams,
	// plus one for each broken stream resumed. Many more would mean reordered or
	// restarted reads.
	if min, max := largeSize/PrefetchBlock, 2*largeSize/PrefetchBlock+4; len(reads) < min || len(reads) > max {
		t.Fatalf("%d read streams for %d bytes, want %d..%d", len(reads), largeSize, min, max)
	}
	for _, r := range reads {
		if r.length <= 0 || r.length > PrefetchBlock {
			t.Fatalf("a read asked for %d bytes at %d (whole object or unbounded)", r.length, r.off)
		}
	}
	e.store.mu.Lock()
	peak := e.store.readsPeak
	e.store.mu.Unlock()
	if peak > PrefetchBlocks+1 {
		t.Fatalf("%d read streams at once, bound %d", peak, PrefetchBlocks+1)
	}
	t.Logf("%d read streams, at most %d at once; heap grew by at most %d MiB", len(reads), peak, grew>>20)
	if grew >= largeSize {
		t.Fatalf("heap grew by %d bytes while streaming a %d-byte file", grew, largeSize)
	}
}

// TestFUSEQuotaRefusalOnClose: an upload the control plane refuses (quota) fails the
// program's close with EDQUOT, and nothing is kept.
func TestFUSEQuotaRefusalOnClose(t *testing.T) {
	requireFUSE(t)
	e := newEnv(t, ModeFUSE)
	e.store.quota = 1000
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	f, err := os.Create(filepath.Join(dir, "too-big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 5000)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("close: %v, want EDQUOT", err)
	}
	if len(e.store.paths()) != 0 {
		t.Fatalf("bucket holds %v", e.store.paths())
	}
}

// TestCopyModeAttachSyncDetach: without FUSE the bucket is copied in (streamed, with the
// objects' times), changes are uploaded by a sync (new, changed, deleted files), and
// detach uploads what changed since and removes the copy.
func TestCopyModeAttachSyncDetach(t *testing.T) {
	e := newEnv(t, ModeCopy)
	seed(e.store)
	etag := e.store.putSynthetic("big.bin", largeSize)
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	if got := names(t, dir); got != "big.bin data/ readme.txt" {
		t.Fatalf("copy lists %q", got)
	}
	if got := readFile(t, filepath.Join(dir, "data/a.csv")); got != "x,y\n1,2\n" {
		t.Fatalf("a.csv %q", got)
	}
	f, err := os.Open(filepath.Join(dir, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	_, _ = io.Copy(h, f)
	f.Close()
	if got := `"` + hex.EncodeToString(h.Sum(nil)) + `"`; got != etag {
		t.Fatalf("big.bin copied with hash %s, want %s", got, etag)
	}
	st, _ := os.Stat(filepath.Join(dir, "readme.txt"))
	if st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", st.Mode())
	}

	// Nothing changed: a sync uploads nothing.
	if rep, err := e.mgr.Sync(context.Background(), attRW); err != nil || rep.Uploaded+rep.Deleted != 0 {
		t.Fatalf("idle sync: %+v %v", rep, err)
	}
	_ = os.WriteFile(filepath.Join(dir, "readme.txt"), []byte("changed in the allocation"), 0o644)
	_ = os.MkdirAll(filepath.Join(dir, "out"), 0o755)
	_ = os.WriteFile(filepath.Join(dir, "out/result.json"), []byte(`{"loss":0.1}`), 0o644)
	_ = os.Remove(filepath.Join(dir, "data/sub/b.bin"))
	_ = os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	rep, err := e.mgr.Sync(context.Background(), attRW)
	if err != nil || rep.Uploaded != 2 || rep.Deleted != 1 {
		t.Fatalf("sync: %+v %v", rep, err)
	}
	if got, _ := e.store.get("readme.txt"); string(got) != "changed in the allocation" {
		t.Fatalf("readme %q", got)
	}
	if got, _ := e.store.get("out/result.json"); string(got) != `{"loss":0.1}` {
		t.Fatalf("result %q", got)
	}
	if got := strings.Join(e.store.paths(), " "); got != "big.bin data/a.csv out/result.json readme.txt" {
		t.Fatalf("bucket %q (a symlink must not be uploaded)", got)
	}

	// Changes after the last sync go up at detach.
	_ = os.WriteFile(filepath.Join(dir, "data/a.csv"), []byte("final"), 0o644)
	r, _ := e.task(alloctask.KindStorageDetach, payload(attRW, alloctask.StorageModeRW))
	if r.Status != tasks.Succeeded {
		t.Fatalf("detach: %+v", r)
	}
	if got, _ := e.store.get("data/a.csv"); string(got) != "final" {
		t.Fatalf("a.csv after detach %q", got)
	}
	if got := names(t, dir); got != "" {
		t.Fatalf("copy left %q", got)
	}
}

// TestCopyModeDetachKeepsFilesWhenUploadRefused: a detach whose changes cannot be
// uploaded fails with storage_sync_failed and keeps the files and the attachment.
func TestCopyModeDetachKeepsFilesWhenUploadRefused(t *testing.T) {
	e := newEnv(t, ModeCopy)
	seed(e.store)
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	e.store.mu.Lock()
	e.store.quota = 1
	e.store.mu.Unlock()
	_ = os.WriteFile(filepath.Join(dir, "new.bin"), make([]byte, 4096), 0o644)
	r, _ := e.task(alloctask.KindStorageDetach, payload(attRW, alloctask.StorageModeRW))
	if r.Status != tasks.Failed || r.ErrorCode != alloctask.CodeStorageSyncFailed {
		t.Fatalf("detach: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "new.bin")); err != nil || len(e.mgr.List()) != 1 {
		t.Fatalf("file or attachment gone: %v, %d held", err, len(e.mgr.List()))
	}
}

// TestCopyModeReadOnly: a ro copy is read-only files and folders, and nothing done to
// it is ever uploaded.
func TestCopyModeReadOnly(t *testing.T) {
	e := newEnv(t, ModeCopy)
	seed(e.store)
	dir := e.attach(payload(attRO, alloctask.StorageModeRO))
	for p, want := range map[string]os.FileMode{"readme.txt": 0o444, "data/sub/b.bin": 0o444, "data": 0o555, "data/sub": 0o555} {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want %v", p, st.Mode(), err, want)
		}
	}
	// Root can write anyway; the change must still stay local.
	_ = os.WriteFile(filepath.Join(dir, "readme.txt"), []byte("local"), 0o644)
	if r, _ := e.task(alloctask.KindStorageDetach, payload(attRO, alloctask.StorageModeRO)); r.Status != tasks.Succeeded {
		t.Fatalf("detach: %+v", r)
	}
	if got, _ := e.store.get("readme.txt"); string(got) != "hello from the bucket\n" || e.store.writes != 0 {
		t.Fatalf("bucket changed: %q", got)
	}
	if got := names(t, dir); got != "" {
		t.Fatalf("copy left %q", got)
	}
}

// TestReleaseDetachesEverything: allocation.release through the agent's mux detaches
// every attachment first (rw copy synced back, FUSE unmounted), so removing the
// allocation's home never deletes bucket objects through a mount.
func TestReleaseDetachesEverything(t *testing.T) {
	for _, mode := range []string{ModeFUSE, ModeCopy} {
		t.Run(mode, func(t *testing.T) {
			if mode == ModeFUSE {
				requireFUSE(t)
			}
			e := newEnv(t, mode)
			seed(e.store)
			dir := e.attach(payload(attRW, alloctask.StorageModeRW))
			ro := payload(attRO, alloctask.StorageModeRO)
			ro.MountPath = "ro/view"
			r, _ := e.task(alloctask.KindStorageAttach, ro)
			if r.Status != tasks.Succeeded {
				t.Fatalf("ro attach %+v", r)
			}
			if err := os.WriteFile(filepath.Join(dir, "written.txt"), []byte("from the allocation"), 0o644); err != nil {
				t.Fatal(err)
			}
			mux := e.rt.Mux()
			e.mgr.Register(mux, e.rt)
			body, _ := json.Marshal(alloctask.Payload{AllocationID: allocID, User: alloctask.UserName(allocID)})
			res := mux.Execute(context.Background(), tasks.Task{ID: "rel", Kind: alloctask.KindRelease, Payload: body})
			if res.Status != tasks.Succeeded {
				t.Fatalf("release: %+v", res)
			}
			if len(e.mgr.List()) != 0 || isMounted(t, dir) {
				t.Fatalf("after release: %d held, mounted %v", len(e.mgr.List()), isMounted(t, dir))
			}
			if _, err := os.Stat(e.home); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("home still there: %v", err)
			}
			if got := strings.Join(e.store.paths(), " "); got != "data/a.csv data/sub/b.bin readme.txt written.txt" {
				t.Fatalf("bucket after release: %q", got)
			}
			// An attach after the release is refused: the allocation is gone.
			if r, _ := e.task(alloctask.KindStorageAttach, payload(attRW, alloctask.StorageModeRW)); r.ErrorCode != alloctask.CodeNotFound {
				t.Fatalf("attach after release: %+v", r)
			}
		})
	}
}

// TestRestoreAfterAgentRestart: a new manager over the same state directory mounts the
// attachments again; one whose allocation was released meanwhile is reported gone and
// its record removed.
func TestRestoreAfterAgentRestart(t *testing.T) {
	requireFUSE(t)
	e := newEnv(t, ModeFUSE)
	seed(e.store)
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	e.mgr.Close() // the agent stops: mounts end, records stay
	if isMounted(t, dir) {
		t.Fatal("still mounted after Close")
	}
	e.mgr = e.newManager()
	t.Cleanup(e.mgr.Close)
	if gone := e.mgr.Restore(context.Background()); len(gone) != 0 {
		t.Fatalf("gone: %+v", gone)
	}
	if got := readFile(t, filepath.Join(dir, "readme.txt")); got != "hello from the bucket\n" {
		t.Fatalf("after restore %q", got)
	}
	e.mgr.Close()

	// The attach task redelivered before Restore ran finds the record and mounts it
	// again; Restore then leaves it alone.
	e.mgr = e.newManager()
	if again := e.attach(payload(attRW, alloctask.StorageModeRW)); again != dir {
		t.Fatalf("redelivered attach after restart: %q", again)
	}
	if gone := e.mgr.Restore(context.Background()); len(gone) != 0 || len(e.mgr.List()) != 1 {
		t.Fatalf("restore after a redelivered attach: gone %+v, %d held", gone, len(e.mgr.List()))
	}
	if got := readFile(t, filepath.Join(dir, "data/a.csv")); got != "x,y\n1,2\n" {
		t.Fatalf("after redelivered attach %q", got)
	}
	e.mgr.Close()

	// Stopped while the agent was down: the attachment waits (not mounted, not gone)
	// and the allocation's restart task mounts it again.
	ap := alloctask.Payload{AllocationID: allocID, User: alloctask.UserName(allocID)}
	if err := e.rt.Stop(context.Background(), ap); err != nil {
		t.Fatal(err)
	}
	e.mgr = e.newManager()
	if gone := e.mgr.Restore(context.Background()); len(gone) != 0 || len(e.mgr.List()) != 0 || isMounted(t, dir) {
		t.Fatalf("restore of a stopped allocation: gone %+v, %d held", gone, len(e.mgr.List()))
	}
	mux := e.rt.Mux()
	e.mgr.Register(mux, e.rt)
	body, _ := json.Marshal(ap)
	if r := mux.Execute(context.Background(), tasks.Task{ID: "restart", Kind: alloctask.KindRestart, Payload: body}); r.Status != tasks.Succeeded {
		t.Fatalf("restart: %+v", r)
	}
	if len(e.mgr.List()) != 1 || readFile(t, filepath.Join(dir, "readme.txt")) != "hello from the bucket\n" {
		t.Fatalf("not mounted again after the restart: %d held", len(e.mgr.List()))
	}
	e.mgr.Close()

	if err := e.rt.Release(context.Background(), alloctask.Payload{AllocationID: allocID, User: alloctask.UserName(allocID)}); err != nil {
		t.Fatal(err)
	}
	e.mgr = e.newManager()
	gone := e.mgr.Restore(context.Background())
	if len(gone) != 1 || gone[0].AttachmentID != attRW {
		t.Fatalf("gone: %+v", gone)
	}
	if again := e.newManager().Restore(context.Background()); len(again) != 0 {
		t.Fatalf("record kept: %+v", again)
	}
}

// TestAttachRefusals: bad payloads, an inactive allocation, a mount path that is not an
// empty directory, and one that a symlink would send outside the home are refused with
// their codes, and nothing is mounted.
func TestAttachRefusals(t *testing.T) {
	e := newEnv(t, ModeCopy)
	seed(e.store)
	bad := payload(attRW, alloctask.StorageModeRW)
	bad.MountPath = "../escape"
	if r, _ := e.task(alloctask.KindStorageAttach, bad); r.ErrorCode != alloctask.CodeInvalidPayload {
		t.Fatalf("traversal: %+v", r)
	}
	other := payload(attRW, alloctask.StorageModeRW)
	other.User = "gffffffffffff"
	if r, _ := e.task(alloctask.KindStorageAttach, other); r.ErrorCode != alloctask.CodeInvalidPayload {
		t.Fatalf("wrong user: %+v", r)
	}
	gone := payload(attRW, alloctask.StorageModeRW)
	gone.AllocationID = "0190f6a0-0000-7000-8000-00000000ffff"
	gone.User = alloctask.UserName(gone.AllocationID)
	if r, _ := e.task(alloctask.KindStorageAttach, gone); r.ErrorCode != alloctask.CodeNotFound {
		t.Fatalf("unknown allocation: %+v", r)
	}
	_ = os.MkdirAll(filepath.Join(e.home, "full"), 0o755)
	_ = os.WriteFile(filepath.Join(e.home, "full/mine.txt"), []byte("x"), 0o644)
	full := payload(attRW, alloctask.StorageModeRW)
	full.MountPath = "full"
	if r, res := e.task(alloctask.KindStorageAttach, full); r.ErrorCode != alloctask.CodeStorageMountFailed || res.ErrorCode != r.ErrorCode {
		t.Fatalf("non-empty mount path: %+v %+v", r, res)
	}
	outside := t.TempDir()
	_ = os.Symlink(outside, filepath.Join(e.home, "link"))
	linked := payload(attRW, alloctask.StorageModeRW)
	linked.MountPath = "link/data"
	if r, _ := e.task(alloctask.KindStorageAttach, linked); r.ErrorCode != alloctask.CodeStorageMountFailed {
		t.Fatalf("symlinked mount path: %+v", r)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 || len(e.mgr.List()) != 0 {
		t.Fatalf("something was made outside the home (%d entries) or attached (%d)", len(ents), len(e.mgr.List()))
	}
	if got := readFile(t, filepath.Join(e.home, "full/mine.txt")); got != "x" {
		t.Fatal("the user's file was touched")
	}
}

// TestCopyModeRestoreKeepsManifest: after an agent restart a copy-mode attachment is
// held again without downloading anew, and only what changed since is uploaded.
func TestCopyModeRestoreKeepsManifest(t *testing.T) {
	e := newEnv(t, ModeCopy)
	seed(e.store)
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	e.mgr.Close()
	e.store.mu.Lock()
	readsBefore := len(e.store.reads)
	e.store.mu.Unlock()
	e.mgr = e.newManager()
	t.Cleanup(e.mgr.Close)
	if gone := e.mgr.Restore(context.Background()); len(gone) != 0 || len(e.mgr.List()) != 1 {
		t.Fatalf("restore: gone %+v, %d held", gone, len(e.mgr.List()))
	}
	e.store.mu.Lock()
	readsAfter := len(e.store.reads)
	e.store.mu.Unlock()
	if readsAfter != readsBefore {
		t.Fatalf("restore downloaded %d objects again", readsAfter-readsBefore)
	}
	_ = os.WriteFile(filepath.Join(dir, "readme.txt"), []byte("after restart"), 0o644)
	rep, err := e.mgr.Sync(context.Background(), attRW)
	if err != nil || rep.Uploaded != 1 || rep.Deleted != 0 {
		t.Fatalf("sync after restart: %+v %v", rep, err)
	}
	if got, _ := e.store.get("readme.txt"); string(got) != "after restart" {
		t.Fatalf("readme %q", got)
	}
}

// TestCopyModePeriodicAndShutdownSync: Run uploads rw copy changes on its interval, and
// once more when the agent stops, so a change made just before a shutdown is not lost.
func TestCopyModePeriodicAndShutdownSync(t *testing.T) {
	e := newEnv(t, ModeCopy)
	e.sync = 20 * time.Millisecond
	e.mgr = e.newManager()
	t.Cleanup(e.mgr.Close)
	seed(e.store)
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.mgr.Run(ctx) }()
	_ = os.WriteFile(filepath.Join(dir, "periodic.txt"), []byte("1"), 0o644)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := e.store.get("periodic.txt"); ok {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("the periodic sync never uploaded the new file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = os.WriteFile(filepath.Join(dir, "last-minute.txt"), []byte("2"), 0o644)
	cancel()
	<-done
	if got, ok := e.store.get("last-minute.txt"); !ok || string(got) != "2" {
		t.Fatalf("the shutdown sync lost a change: %q %v", got, ok)
	}
}

// TestReleaseWithBusyMount: a FUSE mount still in use when the allocation is released
// is detached lazily: release completes (the mount leaves the tree, the home goes) and
// a file that was open for writing still lands in the bucket when it is closed.
func TestReleaseWithBusyMount(t *testing.T) {
	requireFUSE(t)
	e := newEnv(t, ModeFUSE)
	seed(e.store)
	dir := e.attach(payload(attRW, alloctask.StorageModeRW))
	f, err := os.Create(filepath.Join(dir, "late.txt"))
	if err != nil {
		t.Fatal(err)
	}
	mux := e.rt.Mux()
	e.mgr.Register(mux, e.rt)
	body, _ := json.Marshal(alloctask.Payload{AllocationID: allocID, User: alloctask.UserName(allocID)})
	if res := mux.Execute(context.Background(), tasks.Task{ID: "rel", Kind: alloctask.KindRelease, Payload: body}); res.Status != tasks.Succeeded {
		t.Fatalf("release: %+v", res)
	}
	if isMounted(t, dir) || len(e.mgr.List()) != 0 {
		t.Fatal("the busy mount is still in the tree after release")
	}
	if _, err := os.Stat(e.home); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("home still there: %v", err)
	}
	if _, err := f.WriteString("written after the release began"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got, ok := e.store.get("late.txt"); !ok || string(got) != "written after the release began" {
		t.Fatalf("late.txt in the bucket: %q %v", got, ok)
	}
	if got := strings.Join(e.store.paths(), " "); got != "data/a.csv data/sub/b.bin late.txt readme.txt" {
		t.Fatalf("bucket after release: %q", got)
	}
}

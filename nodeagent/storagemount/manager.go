package storagemount

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
	"github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// Modes (the agent's storage_mode setting).
const (
	// ModeAuto mounts with FUSE when /dev/fuse is usable and falls back to copy.
	ModeAuto = "auto"
	ModeFUSE = "fuse"
	ModeCopy = "copy"
)

// DefaultSyncInterval is how often rw copy-mode attachments upload local changes.
const DefaultSyncInterval = 60 * time.Second

// Accounts is what the manager needs of the runtime: the allocation's user, uid/gid and
// home, for an allocation that is active on this node (*runtime.Runtime).
type Accounts interface {
	Session(allocationID string) (runtime.SessionEnv, bool)
	// Phase tells a stopped allocation (whose attachments wait for its restart) from
	// one that is gone.
	Phase(allocationID string) runtime.Phase
}

// Options configure a Manager. StateDir, Client and Accounts are required.
type Options struct {
	// StateDir is the agent's state directory; the manager keeps its records in
	// <StateDir>/storage.
	StateDir string
	Client   *Client
	Accounts Accounts
	// Mode is ModeAuto (default), ModeFUSE or ModeCopy.
	Mode string
	// SyncInterval spaces the periodic upload of rw copy-mode changes (default 60 s).
	SyncInterval time.Duration
	// FUSEDevice is the device probed for FUSE (default /dev/fuse).
	FUSEDevice string
	Logger     *slog.Logger
}

// record is an attachment as the node holds it, on disk so a restarted agent mounts it
// again: <StateDir>/storage/attachments/<attachment id>.json.
type record struct {
	Payload   alloctask.StoragePayload `json:"payload"`
	Method    string                   `json:"method"`
	MountPath string                   `json:"mount_path"`
	UID       int                      `json:"uid"`
	GID       int                      `json:"gid"`
	Attached  time.Time                `json:"attached_at"`
	// Ready is false while a copy-in is under way: an agent that died meanwhile copies
	// in again when it restores the attachment.
	Ready bool `json:"ready"`
}

// mount is a live attachment.
type mount struct {
	rec    record
	server *fuse.Server // FUSE
	cancel context.CancelFunc
	cp     *copyMount // copy
}

// Manager attaches buckets into allocations and detaches them: the agent side of the
// storage.attach and storage.detach tasks, and of allocation release. Safe for
// concurrent use; work on one allocation is serialised.
type Manager struct {
	o     Options
	dir   string
	locks sync.Map // allocation id -> *sync.Mutex

	mu     sync.Mutex
	mounts map[string]*mount // by attachment id
}

// New returns a Manager. Restore mounts what the node held before a restart.
func New(o Options) (*Manager, error) {
	if o.StateDir == "" || o.Client == nil || o.Accounts == nil {
		return nil, errors.New("storagemount: StateDir, Client and Accounts are required")
	}
	switch o.Mode {
	case "":
		o.Mode = ModeAuto
	case ModeAuto, ModeFUSE, ModeCopy:
	default:
		return nil, fmt.Errorf("storagemount: mode %q is not auto, fuse or copy", o.Mode)
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.FUSEDevice == "" {
		o.FUSEDevice = "/dev/fuse"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{o: o, dir: filepath.Join(o.StateDir, "storage"), mounts: map[string]*mount{}}
	for _, d := range []string{m.recordDir(), m.spoolRoot()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("storagemount: %w", err)
		}
	}
	return m, nil
}

func (m *Manager) recordDir() string { return filepath.Join(m.dir, "attachments") }
func (m *Manager) spoolRoot() string { return filepath.Join(m.dir, "spool") }
func (m *Manager) recordPath(id string) string {
	return filepath.Join(m.recordDir(), id+".json")
}
func (m *Manager) manifestPath(id string) string {
	return filepath.Join(m.recordDir(), id+".manifest.json")
}

func (m *Manager) lock(allocationID string) func() {
	v, _ := m.locks.LoadOrStore(allocationID, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// taskError carries an alloctask error code.
type taskError struct {
	code string
	err  error
}

func (e *taskError) Error() string { return e.err.Error() }
func (e *taskError) Unwrap() error { return e.err }

func fail(code string, err error) error { return &taskError{code: code, err: err} }

// Code is the alloctask error code of an error from Attach or Detach.
func Code(err error) string {
	var te *taskError
	if errors.As(err, &te) {
		return te.code
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.PermissionDenied, codes.NotFound:
		return alloctask.CodeStorageUnavailable
	}
	return alloctask.CodeStorageMountFailed
}

// Attached describes one attachment the node holds.
type Attached struct {
	AttachmentID string
	AllocationID string
	BucketID     string
	Mode         string
	Method       string
	MountPath    string
}

// List returns the attachments the node holds, by attachment id.
func (m *Manager) List() []Attached {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Attached, 0, len(m.mounts))
	for id, mt := range m.mounts {
		p := mt.rec.Payload
		out = append(out, Attached{AttachmentID: id, AllocationID: p.AllocationID, BucketID: p.BucketID, Mode: p.Mode, Method: mt.rec.Method, MountPath: mt.rec.MountPath})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].AttachmentID < out[j].AttachmentID })
	return out
}

// Attach makes the bucket appear in the allocation. An attachment the node already
// holds is reported as it is (a redelivered task).
func (m *Manager) Attach(ctx context.Context, p alloctask.StoragePayload) (alloctask.StorageResult, error) {
	if err := p.Validate(); err != nil {
		return alloctask.StorageResult{}, fail(alloctask.CodeInvalidPayload, err)
	}
	unlock := m.lock(p.AllocationID)
	defer unlock()
	m.mu.Lock()
	mt := m.mounts[p.AttachmentID]
	m.mu.Unlock()
	if mt != nil {
		if mt.rec.Payload.AllocationID != p.AllocationID {
			return alloctask.StorageResult{}, fail(alloctask.CodeInvalidPayload, fmt.Errorf("attachment %s belongs to allocation %s", p.AttachmentID, mt.rec.Payload.AllocationID))
		}
		return alloctask.StorageResult{Method: mt.rec.Method, MountPath: mt.rec.MountPath}, nil
	}
	env, ok := m.o.Accounts.Session(p.AllocationID)
	if !ok {
		return alloctask.StorageResult{}, fail(alloctask.CodeNotFound, fmt.Errorf("allocation %s is not active on this node", p.AllocationID))
	}
	if rec, ok := m.loadRecord(p.AttachmentID); ok && rec.Payload.AllocationID == p.AllocationID {
		// Held before a restart and not restored yet (Restore runs beside the first
		// tasks): mount it again as it was.
		if err := m.start(ctx, &rec, false); err != nil {
			return alloctask.StorageResult{}, err
		}
		return alloctask.StorageResult{Method: rec.Method, MountPath: rec.MountPath}, nil
	}
	if env.User != p.User {
		return alloctask.StorageResult{}, fail(alloctask.CodeInvalidPayload, fmt.Errorf("user %q is not the allocation's runtime user %q", p.User, env.User))
	}
	uid, gid := os.Getuid(), os.Getgid()
	if env.RealUser {
		uid, gid = int(env.UID), int(env.GID)
	}
	rec := record{Payload: p, UID: uid, GID: gid, Attached: time.Now().UTC()}
	abs, err := m.mountPoint(env.Dir, p.EffectiveMountPath(), uid, gid)
	if err != nil {
		return alloctask.StorageResult{}, fail(alloctask.CodeStorageMountFailed, err)
	}
	rec.MountPath = abs
	// The control plane must know the attachment before the bytes are needed: a refusal
	// (not this node's, unknown) is reported by the attach, not by the first read.
	if _, err := m.o.Client.List(ctx, p.AttachmentID, "", "/", "", 1); err != nil {
		return alloctask.StorageResult{}, fail(alloctask.CodeStorageUnavailable, fmt.Errorf("the control plane refused the attachment: %w", err))
	}
	if err := m.start(ctx, &rec, true); err != nil {
		return alloctask.StorageResult{}, err
	}
	return alloctask.StorageResult{Method: rec.Method, MountPath: rec.MountPath}, nil
}

// mountPoint creates home/rel (owned by the user) through an os.Root on the home, so a
// symlink the user planted cannot send the mount elsewhere, and checks that the path
// the kernel will resolve is that directory and that it is empty.
func (m *Manager) mountPoint(home, rel string, uid, gid int) (string, error) {
	if !filepath.IsAbs(home) {
		return "", fmt.Errorf("home %q is not absolute", home)
	}
	root, err := os.OpenRoot(home)
	if err != nil {
		return "", err
	}
	defer root.Close()
	cur := ""
	for _, el := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, el)
		err := root.Mkdir(cur, 0o755)
		if err == nil {
			err = root.Lchown(cur, uid, gid)
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	abs := filepath.Join(home, rel)
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	if realHome, err := filepath.EvalSymlinks(home); err != nil || real != filepath.Join(realHome, rel) {
		return "", fmt.Errorf("mount path %s is not a plain directory under the home (a symlink?)", abs)
	}
	f, err := root.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("mount path %s is not a directory", abs)
	}
	if names, _ := f.Readdirnames(1); len(names) > 0 {
		return "", fmt.Errorf("mount path %s is not empty", abs)
	}
	return real, nil
}

// start mounts rec (FUSE or copy, as the mode and the host allow), saves the record and
// registers the mount. fresh is false when restoring after a restart (a copy-mode
// directory keeps what it has).
func (m *Manager) start(ctx context.Context, rec *record, fresh bool) error {
	id := rec.Payload.AttachmentID
	log := m.o.Logger.With("attachment_id", id, "allocation_id", rec.Payload.AllocationID, "bucket_id", rec.Payload.BucketID, "mode", rec.Payload.Mode)
	method := rec.Method
	if method == "" {
		method = alloctask.StorageMethodCopy
		if m.o.Mode != ModeCopy && fuseUsable(m.o.FUSEDevice) {
			method = alloctask.StorageMethodFUSE
		} else if m.o.Mode == ModeFUSE {
			return fail(alloctask.CodeStorageMountFailed, fmt.Errorf("storage_mode is fuse but %s is not usable", m.o.FUSEDevice))
		}
	}
	mt := &mount{rec: *rec}
	var err error
	if method == alloctask.StorageMethodFUSE {
		err = m.mountFUSE(mt, log)
		if err != nil && m.o.Mode == ModeAuto && rec.Method == "" {
			log.Warn("storage: FUSE mount failed; falling back to copy mode", "err", err)
			method, err = alloctask.StorageMethodCopy, nil
		}
		if err != nil {
			return fail(alloctask.CodeStorageMountFailed, err)
		}
	}
	mt.rec.Method = method
	mt.rec.Ready = method == alloctask.StorageMethodFUSE || (rec.Ready && !fresh)
	// The record goes to disk before a copy-in, so a detach or release after a crash
	// half-way still finds (and removes) what was downloaded.
	if err := m.saveRecord(mt.rec); err != nil {
		m.unmountFUSE(mt, log)
		return fail(alloctask.CodeStorageMountFailed, err)
	}
	if method == alloctask.StorageMethodCopy {
		mt.cp = &copyMount{c: m.o.Client, att: id, rw: rec.Payload.Mode == alloctask.StorageModeRW, dir: rec.MountPath,
			uid: rec.UID, gid: rec.GID, manifestPath: m.manifestPath(id), log: log}
		if err := mt.cp.loadManifest(); err != nil {
			return fail(alloctask.CodeStorageMountFailed, err)
		}
		if !mt.rec.Ready {
			if err := mt.cp.copyIn(ctx); err != nil {
				if fresh {
					m.removeCopy(mt, log)
					_ = m.removeRecord(id)
				}
				if Code(err) == alloctask.CodeStorageUnavailable {
					return fail(alloctask.CodeStorageUnavailable, fmt.Errorf("copying the bucket in: %w", err))
				}
				return fail(alloctask.CodeStorageMountFailed, fmt.Errorf("copying the bucket in: %w", err))
			}
			mt.rec.Ready = true
			if err := m.saveRecord(mt.rec); err != nil {
				return fail(alloctask.CodeStorageMountFailed, err)
			}
		}
	}
	*rec = mt.rec
	m.mu.Lock()
	m.mounts[id] = mt
	m.mu.Unlock()
	log.Info("storage attached", "method", method, "mount_path", rec.MountPath)
	return nil
}

// fuseUsable reports whether the FUSE device can be opened.
func fuseUsable(dev string) bool {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	_ = f.Close()
	return true
}

func (m *Manager) mountFUSE(mt *mount, log *slog.Logger) error {
	rec := mt.rec
	id := rec.Payload.AttachmentID
	spool := filepath.Join(m.spoolRoot(), id)
	if err := os.RemoveAll(spool); err != nil {
		return err
	}
	if err := os.MkdirAll(spool, 0o700); err != nil {
		return err
	}
	// A mount left by an agent that died is dead ("transport endpoint is not
	// connected"): detach it before mounting again.
	_ = syscall.Unmount(rec.MountPath, syscall.MNT_DETACH)
	ctx, cancel := context.WithCancel(context.Background())
	bfs := newBucketFS(ctx, m.o.Client, id, rec.Payload.Mode == alloctask.StorageModeRW, uint32(rec.UID), uint32(rec.GID), spool, log)
	timeout := time.Second
	opts := &gofs.Options{
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: new(time.Duration),
		UID:             uint32(rec.UID),
		GID:             uint32(rec.GID),
		MountOptions: fuse.MountOptions{
			// The agent (root) serves files to the allocation's user; the kernel checks
			// the modes and owners this filesystem reports.
			AllowOther:    rec.UID != os.Getuid(),
			Options:       []string{"default_permissions"},
			FsName:        "gantry-bucket:" + rec.Payload.BucketID,
			Name:          "gantry",
			DirectMount:   true,
			DisableXAttrs: true,
			MaxWrite:      1 << 20,
			// Reads arrive in order, so a sequentially read file stays on one growing
			// readahead range instead of restarting streams for reordered requests.
			SyncRead:     true,
			MaxReadAhead: 1 << 20,
		},
	}
	srv, err := gofs.Mount(rec.MountPath, bfs.root(), opts)
	if err != nil {
		cancel()
		return err
	}
	mt.server, mt.cancel = srv, cancel
	return nil
}

// unmountFUSE ends a FUSE mount: a plain unmount, or, when something in the allocation
// still uses it, a lazy one (the mount leaves the tree at once and ends when the last
// file is closed; content written until then is still uploaded).
func (m *Manager) unmountFUSE(mt *mount, log *slog.Logger) {
	if mt.server == nil {
		return
	}
	if err := mt.server.Unmount(); err != nil {
		log.Info("storage: mount busy; detaching it lazily", "err", err)
		if err := syscall.Unmount(mt.rec.MountPath, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			log.Error("storage: lazy unmount failed", "err", err)
		}
		go func(srv *fuse.Server, cancel context.CancelFunc) {
			srv.Wait()
			cancel()
		}(mt.server, mt.cancel)
	} else {
		mt.server.Wait()
		mt.cancel()
	}
	_ = os.RemoveAll(filepath.Join(m.spoolRoot(), mt.rec.Payload.AttachmentID))
}

// removeCopy deletes a copy-mode directory's contents and the directory (through an
// os.Root on its parent: the user may have planted links inside).
func (m *Manager) removeCopy(mt *mount, log *slog.Logger) {
	parent, name := filepath.Split(mt.rec.MountPath)
	root, err := os.OpenRoot(parent)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Error("storage: removing the copy", "err", err)
		}
		return
	}
	defer root.Close()
	// Read-only copies have read-only folders: make them writable so they can go.
	_ = fs.WalkDir(root.FS(), name, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = root.Chmod(p, 0o755)
		}
		return nil
	})
	if err := root.RemoveAll(name); err != nil {
		log.Error("storage: removing the copy", "err", err)
	}
	// An empty mount point is left as it was made: the user may reuse it.
	_ = root.Mkdir(name, 0o755)
	_ = root.Lchown(name, mt.rec.UID, mt.rec.GID)
}

// Detach removes the attachment from the allocation: a FUSE mount is unmounted; a copy
// is synced back (rw) and removed. A rw copy whose changes cannot all be uploaded stays
// (CodeStorageSyncFailed) so nothing written in the allocation is lost. Detaching an
// attachment the node does not hold succeeds.
func (m *Manager) Detach(ctx context.Context, p alloctask.StoragePayload) (alloctask.StorageResult, error) {
	if err := p.Validate(); err != nil {
		return alloctask.StorageResult{}, fail(alloctask.CodeInvalidPayload, err)
	}
	unlock := m.lock(p.AllocationID)
	defer unlock()
	return m.detachLocked(ctx, p.AttachmentID, true)
}

func (m *Manager) detachLocked(ctx context.Context, id string, mustSync bool) (alloctask.StorageResult, error) {
	m.mu.Lock()
	mt := m.mounts[id]
	m.mu.Unlock()
	if mt == nil {
		return alloctask.StorageResult{}, nil
	}
	log := m.o.Logger.With("attachment_id", id, "allocation_id", mt.rec.Payload.AllocationID)
	res := alloctask.StorageResult{Method: mt.rec.Method, MountPath: mt.rec.MountPath}
	if mt.cp != nil {
		rep, err := mt.cp.finish(ctx, !mustSync)
		if err != nil {
			if mustSync {
				return res, fail(alloctask.CodeStorageSyncFailed, fmt.Errorf("uploading the allocation's changes: %w", err))
			}
			log.Error("storage: changes could not all be uploaded before release; they are lost", "err", err)
		}
		log.Info("storage copy synced", "uploaded", rep.Uploaded, "deleted", rep.Deleted, "skipped", rep.Skipped)
		m.removeCopy(mt, log)
	} else {
		m.unmountFUSE(mt, log)
	}
	if err := m.removeRecord(id); err != nil {
		return res, fail(alloctask.CodeStorageMountFailed, err)
	}
	m.mu.Lock()
	delete(m.mounts, id)
	m.mu.Unlock()
	log.Info("storage detached", "method", mt.rec.Method)
	return res, nil
}

// DetachAllocation detaches every attachment of the allocation (before its release:
// a rw copy is synced back first; a failed upload is logged, since the allocation goes
// either way).
func (m *Manager) DetachAllocation(ctx context.Context, allocationID string) error {
	unlock := m.lock(allocationID)
	defer unlock()
	var errs []error
	for _, a := range m.List() {
		if a.AllocationID != allocationID {
			continue
		}
		if _, err := m.detachLocked(ctx, a.AttachmentID, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sync uploads the changes of one rw copy-mode attachment now.
func (m *Manager) Sync(ctx context.Context, attachmentID string) (SyncReport, error) {
	m.mu.Lock()
	mt := m.mounts[attachmentID]
	m.mu.Unlock()
	if mt == nil || mt.cp == nil {
		return SyncReport{}, nil
	}
	return mt.cp.sync(ctx)
}

// ShutdownSync bounds the last sync of rw copies when the agent stops.
const ShutdownSync = 30 * time.Second

// Run syncs rw copy-mode attachments every SyncInterval until ctx ends; then it syncs
// them once more (within ShutdownSync, so a stopping agent loses no change it could
// upload) and closes every mount (Close).
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.o.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownSync)
			m.syncAll(sctx)
			cancel()
			m.Close()
			return
		case <-t.C:
		}
		m.syncAll(ctx)
	}
}

func (m *Manager) syncAll(ctx context.Context) {
	for _, a := range m.List() {
		if a.Method != alloctask.StorageMethodCopy || a.Mode != alloctask.StorageModeRW {
			continue
		}
		rep, err := m.Sync(ctx, a.AttachmentID)
		if err != nil && ctx.Err() == nil {
			m.o.Logger.Warn("storage sync failed", "attachment_id", a.AttachmentID, "err", err)
		} else if rep.Uploaded+rep.Deleted > 0 {
			m.o.Logger.Info("storage sync", "attachment_id", a.AttachmentID, "uploaded", rep.Uploaded, "deleted", rep.Deleted)
		}
	}
}

// Close ends every FUSE mount (agent shutdown); the records stay, so the next start
// mounts them again (Restore). Copy-mode directories stay as they are.
func (m *Manager) Close() {
	m.mu.Lock()
	mounts := make([]*mount, 0, len(m.mounts))
	for _, mt := range m.mounts {
		mounts = append(mounts, mt)
	}
	m.mounts = map[string]*mount{}
	m.mu.Unlock()
	for _, mt := range mounts {
		if mt.server != nil {
			m.unmountFUSE(mt, m.o.Logger.With("attachment_id", mt.rec.Payload.AttachmentID))
		}
	}
}

// Gone is an attachment Restore found that the node cannot hold any more.
type Gone struct {
	AttachmentID string
	AllocationID string
	Reason       string
}

// Restore mounts again every attachment recorded before a restart whose allocation is
// still active here. One of a stopped allocation is kept for the allocation's restart
// (the restart task mounts it, see Register). The others (allocation released or gone
// meanwhile, mount failing) are cleaned up and returned, for the caller to report.
func (m *Manager) Restore(ctx context.Context) []Gone { return m.restore(ctx, "") }

// restore is Restore for every allocation (allocationID "") or one.
func (m *Manager) restore(ctx context.Context, allocationID string) []Gone {
	entries, err := os.ReadDir(m.recordDir())
	if err != nil {
		m.o.Logger.Error("storage: reading attachment records", "err", err)
		return nil
	}
	var gone []Gone
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasSuffix(name, ".manifest.json") {
			continue
		}
		var rec record
		b, err := os.ReadFile(filepath.Join(m.recordDir(), name))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err == nil {
			err = rec.Payload.Validate()
		}
		if err != nil || rec.Payload.AttachmentID+".json" != name {
			m.o.Logger.Error("storage: attachment record unreadable; removed", "file", name, "err", err)
			_ = os.Remove(filepath.Join(m.recordDir(), name))
			continue
		}
		p := rec.Payload
		if allocationID != "" && p.AllocationID != allocationID {
			continue
		}
		unlock := m.lock(p.AllocationID)
		m.mu.Lock()
		held := m.mounts[p.AttachmentID] != nil
		m.mu.Unlock()
		if held {
			unlock() // a redelivered attach restored it first
			continue
		}
		reason := ""
		if _, ok := m.o.Accounts.Session(p.AllocationID); !ok {
			if m.o.Accounts.Phase(p.AllocationID) == runtime.PhaseStopped {
				m.o.Logger.Info("storage attachment waits for its allocation's restart", "attachment_id", p.AttachmentID, "allocation_id", p.AllocationID)
				unlock()
				continue
			}
			reason = "allocation is no longer active on this node"
		} else if err := m.start(ctx, &rec, false); err != nil {
			reason = "mounting again failed: " + err.Error()
		}
		if reason != "" {
			if rec.Method == alloctask.StorageMethodFUSE {
				_ = syscall.Unmount(rec.MountPath, syscall.MNT_DETACH)
			}
			_ = m.removeRecord(p.AttachmentID)
			gone = append(gone, Gone{AttachmentID: p.AttachmentID, AllocationID: p.AllocationID, Reason: reason})
			m.o.Logger.Warn("storage attachment gone after restart", "attachment_id", p.AttachmentID, "reason", reason)
		}
		unlock()
	}
	return gone
}

func (m *Manager) loadRecord(id string) (record, bool) {
	var rec record
	b, err := os.ReadFile(m.recordPath(id))
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.Payload.Validate() != nil || rec.Payload.AttachmentID != id || rec.MountPath == "" {
		return record{}, false
	}
	return rec, true
}

func (m *Manager) saveRecord(rec record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(m.recordPath(rec.Payload.AttachmentID), append(b, '\n'), 0o600)
}

func (m *Manager) removeRecord(id string) error {
	for _, p := range []string{m.manifestPath(id), m.recordPath(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------
// Tasks

// maxPayloadBytes bounds a storage task payload.
const maxPayloadBytes = 16 << 10

// Execute implements tasks.Executor for storage.attach and storage.detach: the payload
// is a JSON alloctask.StoragePayload, the output a JSON alloctask.StorageResult (also on
// failure, with the error code and message).
func (m *Manager) Execute(ctx context.Context, t tasks.Task) tasks.Result {
	var p alloctask.StoragePayload
	var err error
	switch {
	case t.ContentType != "" && t.ContentType != alloctask.ContentType:
		err = fail(alloctask.CodeInvalidPayload, fmt.Errorf("content type %q, want %s", t.ContentType, alloctask.ContentType))
	case len(t.Payload) > maxPayloadBytes:
		err = fail(alloctask.CodeInvalidPayload, fmt.Errorf("payload of %d bytes, at most %d", len(t.Payload), maxPayloadBytes))
	default:
		if jerr := json.Unmarshal(t.Payload, &p); jerr != nil {
			err = fail(alloctask.CodeInvalidPayload, fmt.Errorf("payload is not a storage task: %w", jerr))
		}
	}
	var res alloctask.StorageResult
	if err == nil {
		switch t.Kind {
		case alloctask.KindStorageAttach:
			res, err = m.Attach(ctx, p)
		case alloctask.KindStorageDetach:
			res, err = m.Detach(ctx, p)
		default:
			return tasks.Fail(tasks.CodeUnsupportedKind, fmt.Errorf("task kind %q is not a storage task", t.Kind))
		}
	}
	out := tasks.Result{Status: tasks.Succeeded}
	if err != nil {
		code := Code(err)
		if ctx.Err() != nil {
			code = tasks.CodeCancelled
		}
		out = tasks.Fail(code, err)
		res.ErrorCode, res.ErrorMessage = code, err.Error()
	}
	if b, merr := json.Marshal(res); merr == nil {
		out.Output = b
	}
	return out
}

// Register routes storage.attach and storage.detach to m, and wraps the allocation
// executor (the runtime) for two kinds: allocation.release detaches every attachment of
// the allocation first (WrapRelease: the runtime removes the home, and would remove a
// mount's objects through it), allocation.restart mounts afterwards what waited for it
// (attachments of an allocation that was stopped when the agent restarted).
func (m *Manager) Register(mux *tasks.Mux, allocations tasks.Executor) {
	for _, k := range alloctask.StorageKinds {
		mux.Handle(k, m)
	}
	mux.Handle(alloctask.KindRelease, m.WrapRelease(allocations))
	mux.Handle(alloctask.KindRestart, tasks.ExecutorFunc(func(ctx context.Context, t tasks.Task) tasks.Result {
		res := allocations.Execute(ctx, t)
		var p alloctask.Payload
		if res.Status == tasks.Succeeded && json.Unmarshal(t.Payload, &p) == nil && p.AllocationID != "" {
			for _, g := range m.restore(ctx, p.AllocationID) {
				m.o.Logger.Warn("storage attachment not mounted again after restart", "attachment_id", g.AttachmentID, "reason", g.Reason)
			}
		}
		return res
	}))
}

// WrapRelease returns an executor that detaches every attachment of the allocation
// named by an allocation.release task, then runs next.
func (m *Manager) WrapRelease(next tasks.Executor) tasks.Executor {
	return tasks.ExecutorFunc(func(ctx context.Context, t tasks.Task) tasks.Result {
		var p alloctask.Payload
		if err := json.Unmarshal(t.Payload, &p); err == nil && p.AllocationID != "" {
			if err := m.DetachAllocation(ctx, p.AllocationID); err != nil {
				m.o.Logger.Error("storage: detaching before release", "allocation_id", p.AllocationID, "err", err)
			}
		}
		return next.Execute(ctx, t)
	})
}

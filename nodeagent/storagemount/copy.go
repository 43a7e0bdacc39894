package storagemount

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// tmpPrefix marks a download in progress; sync never uploads such a file.
const tmpPrefix = ".gantry-download-"

// manifestEntry is what the node last knew an object and its local copy to be: a file
// whose size and modification time still match was not changed in the allocation.
type manifestEntry struct {
	Size    int64  `json:"size"`
	ModTime int64  `json:"mtime_ns"`
	ETag    string `json:"etag"`
}

// copyMount is an attachment in copy mode: the bucket's objects downloaded into the
// mount directory at attach; for rw, local changes are uploaded (new and changed files)
// and applied (deleted files) by sync, periodically and at detach.
type copyMount struct {
	c            *Client
	att          string
	rw           bool
	dir          string // absolute
	uid, gid     int
	manifestPath string
	log          *slog.Logger

	mu       sync.Mutex // one copy-in or sync at a time
	manifest map[string]manifestEntry
	// closed is set by the final sync of a detach: the directory is about to be removed,
	// and a periodic sync that was waiting must not read the removal as deletions.
	closed bool
}

// SyncReport counts what one sync did.
type SyncReport struct {
	Uploaded, Deleted, Skipped int
}

func (m *copyMount) loadManifest() error {
	m.manifest = map[string]manifestEntry{}
	b, err := os.ReadFile(m.manifestPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(b, &m.manifest)
}

func (m *copyMount) saveManifest() error {
	b, err := json.Marshal(m.manifest)
	if err != nil {
		return err
	}
	return atomicfile.Write(m.manifestPath, b, 0o600)
}

func (m *copyMount) fileMode() os.FileMode {
	if m.rw {
		return 0o644
	}
	return 0o444
}

// localPath reports whether an object path can be a file under the mount directory.
func localPath(p string) bool {
	if p == "" || !utf8.ValidString(p) || strings.ContainsAny(p, "\\\x00") || path.Clean(p) != p || !fs.ValidPath(p) {
		return false
	}
	for _, el := range strings.Split(p, "/") {
		if strings.HasPrefix(el, tmpPrefix) {
			return false
		}
	}
	return true
}

// copyIn downloads every object into the directory, each streamed to a temporary file
// and renamed into place; everything goes through an os.Root on the mount directory, so
// no object path (nor a symlink the user planted) leads outside it.
func (m *copyMount) copyIn(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	root, err := os.OpenRoot(m.dir)
	if err != nil {
		return err
	}
	defer root.Close()
	var skipped int
	err = m.c.ListAll(ctx, m.att, "", func(o *fabricv1.StorageObjectInfo) error {
		p := o.GetPath()
		if !localPath(p) {
			skipped++
			m.log.Warn("storage copy-in: object path cannot be a file here; skipped", "attachment_id", m.att, "path", p)
			return nil
		}
		if err := m.download(ctx, root, o); err != nil {
			if status.Code(err) != codes.Unknown || ctx.Err() != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			// A local conflict (an object "a" beside objects under "a/"): the first wins.
			skipped++
			m.log.Warn("storage copy-in: object skipped", "attachment_id", m.att, "path", p, "err", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !m.rw {
		// Read-only copies: folders too, so nothing can be added beside them.
		_ = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = root.Chmod(p, 0o555)
			}
			return nil
		})
	}
	return m.saveManifest()
}

func (m *copyMount) download(ctx context.Context, root *os.Root, o *fabricv1.StorageObjectInfo) error {
	p := o.GetPath()
	if dir := path.Dir(p); dir != "." {
		if err := m.mkdirs(root, dir); err != nil {
			return err
		}
	}
	tmp := path.Join(path.Dir(p), tmpPrefix+path.Base(p))
	_ = root.Remove(tmp)
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	r, err := m.c.Open(ctx, m.att, p, 0, 0, o.GetEtag())
	if err == nil {
		_, err = io.Copy(f, r)
		_ = r.Close()
	}
	if err == nil {
		err = f.Chown(m.uid, m.gid)
	}
	if err == nil {
		err = f.Chmod(m.fileMode())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	var mt time.Time
	if err == nil {
		mt = o.GetUpdatedAt().AsTime()
		err = root.Chtimes(tmp, mt, mt)
	}
	if err == nil {
		err = root.Rename(tmp, p)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return err
	}
	st, err := root.Lstat(p)
	if err != nil {
		return err
	}
	m.manifest[p] = manifestEntry{Size: st.Size(), ModTime: st.ModTime().UnixNano(), ETag: o.GetEtag()}
	return nil
}

// mkdirs makes dir and its parents under root, owned by the user.
func (m *copyMount) mkdirs(root *os.Root, dir string) error {
	cur := ""
	for _, el := range strings.Split(dir, "/") {
		cur = path.Join(cur, el)
		err := root.Mkdir(cur, 0o755)
		if err == nil {
			err = root.Lchown(cur, m.uid, m.gid)
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// sync uploads files that are new or changed since the manifest (size or modification
// time differ) and deletes the objects of files that are gone. Symlinks and special
// files are never followed or uploaded. Every file is tried; the errors are joined.
func (m *copyMount) sync(ctx context.Context) (SyncReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncLocked(ctx)
}

// finish is a detach's last sync: when it succeeds (or failure is accepted, force) no
// later sync runs.
func (m *copyMount) finish(ctx context.Context, force bool) (SyncReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rep, err := m.syncLocked(ctx)
	if err == nil || force {
		m.closed = true
	}
	return rep, err
}

func (m *copyMount) syncLocked(ctx context.Context) (SyncReport, error) {
	var rep SyncReport
	if !m.rw || m.closed {
		return rep, nil
	}
	root, err := os.OpenRoot(m.dir)
	if err != nil {
		return rep, err
	}
	defer root.Close()
	seen := map[string]bool{}
	var errs []error
	werr := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		if p == "." || d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() || !localPath(p) || len(p) > maxObjectPath {
			if d.Type().IsRegular() {
				rep.Skipped++
			}
			return nil
		}
		seen[p] = true
		if err := m.syncFile(ctx, root, p, &rep); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
		return ctx.Err()
	})
	if werr != nil {
		errs = append(errs, werr)
	}
	gone := make([]string, 0)
	for p := range m.manifest {
		if !seen[p] {
			gone = append(gone, p)
		}
	}
	sort.Strings(gone)
	for _, p := range gone {
		err := m.c.Delete(ctx, m.att, p)
		if err != nil && status.Code(err) != codes.NotFound {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		delete(m.manifest, p)
		rep.Deleted++
	}
	if err := m.saveManifest(); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

func (m *copyMount) syncFile(ctx context.Context, root *os.Root, p string, rep *SyncReport) error {
	// O_NONBLOCK: a FIFO swapped in after the walk must not hang the sync; the fstat
	// below refuses anything but a regular file.
	f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return nil
	}
	if e, ok := m.manifest[p]; ok && e.Size == st.Size() && e.ModTime == st.ModTime().UnixNano() {
		return nil
	}
	info, err := uploadRetrying(ctx, m.c, m.att, p, func() (io.Reader, int64, error) {
		return io.NewSectionReader(f, 0, st.Size()), st.Size(), nil
	})
	if err != nil {
		return err
	}
	m.manifest[p] = manifestEntry{Size: st.Size(), ModTime: st.ModTime().UnixNano(), ETag: info.GetEtag()}
	rep.Uploaded++
	return nil
}

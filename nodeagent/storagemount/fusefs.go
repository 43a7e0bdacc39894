package storagemount

import (
	"context"
	"errors"
	"hash/fnv"
	"io"
	"log/slog"
	"mime"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

const (
	// attrFresh is how long a file's metadata is trusted before Getattr asks again
	// (the kernel caches it for as long too).
	attrFresh = time.Second
	// maxObjectPath is the protocol's limit on an object path.
	maxObjectPath = 1024
)

// bucketFS is one attachment's FUSE filesystem: objects are files, "/" in their paths
// makes folders. Folders have no object of their own: one exists while an object lives
// under it, or (rw) after mkdir until the mount ends.
type bucketFS struct {
	ctx      context.Context // the mount's lifetime: background uploads use it
	c        *Client
	att      string
	rw       bool
	uid, gid uint32
	spoolDir string
	log      *slog.Logger

	mu    sync.Mutex
	vdirs map[string]bool      // folders made by mkdir (paths without trailing slash)
	local map[string]*fileNode // files created here and not uploaded yet
}

func newBucketFS(ctx context.Context, c *Client, att string, rw bool, uid, gid uint32, spoolDir string, log *slog.Logger) *bucketFS {
	return &bucketFS{ctx: ctx, c: c, att: att, rw: rw, uid: uid, gid: gid, spoolDir: spoolDir, log: log,
		vdirs: map[string]bool{}, local: map[string]*fileNode{}}
}

func (b *bucketFS) root() *dirNode { return &dirNode{b: b} }

func ino(kind, p string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(kind))
	_, _ = h.Write([]byte(p))
	// 1 is the root's inode number.
	return h.Sum64() | 2
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// errno maps a StorageFabric error to what a program in the allocation sees.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	switch status.Code(err) {
	case codes.NotFound:
		return syscall.ENOENT
	case codes.PermissionDenied:
		return syscall.EACCES
	case codes.ResourceExhausted:
		return syscall.EDQUOT
	case codes.InvalidArgument:
		return syscall.EINVAL
	case codes.FailedPrecondition:
		return syscall.ESTALE
	case codes.Canceled:
		return syscall.EINTR
	default:
		return syscall.EIO
	}
}

func (b *bucketFS) dirMode() uint32 {
	if b.rw {
		return 0o755
	}
	return 0o555
}

func (b *bucketFS) fileMode() uint32 {
	if b.rw {
		return 0o644
	}
	return 0o444
}

// ---------------------------------------------------------------------------------------
// Folders

type dirNode struct {
	fs.Inode
	b    *bucketFS
	path string // "" for the root
}

var (
	_ fs.NodeLookuper  = (*dirNode)(nil)
	_ fs.NodeReaddirer = (*dirNode)(nil)
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)
)

// Statfs reports a large nominal capacity: the agent does not know the project's quota
// (the control plane enforces it on every upload), and programs that check free space
// before writing (dataset downloaders) must not see a full disk.
func (d *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	const blocks = 1 << 38 // 1 PiB of 4 KiB blocks
	out.Bsize, out.Frsize, out.NameLen = 4096, 4096, 255
	out.Blocks, out.Bfree, out.Bavail = blocks, blocks, blocks
	out.Files, out.Ffree = 1<<32, 1<<32
	return 0
}

func (d *dirNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.b.dirAttr(&out.Attr)
	return 0
}

// Setattr accepts mode and time changes without keeping them (a bucket has no folder
// metadata), so `cp -a` and `rsync` into a rw mount work.
func (d *dirNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !d.b.rw {
		return syscall.EROFS
	}
	d.b.dirAttr(&out.Attr)
	return 0
}

func (b *bucketFS) dirAttr(a *fuse.Attr) {
	a.Mode = fuse.S_IFDIR | b.dirMode()
	a.Nlink = 2
	a.Owner = fuse.Owner{Uid: b.uid, Gid: b.gid}
}

func (d *dirNode) child(name string) (string, syscall.Errno) {
	p := join(d.path, name)
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") || len(p) > maxObjectPath {
		return "", syscall.EINVAL
	}
	return p, 0
}

func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, e := d.child(name)
	if e != 0 {
		return nil, syscall.ENOENT
	}
	b := d.b
	b.mu.Lock()
	ln := b.local[p]
	b.mu.Unlock()
	if ln != nil {
		ch := d.fileInode(ctx, p, nil)
		ch.Operations().(*fileNode).attr(&out.Attr)
		return ch, 0
	}
	info, err := b.c.Stat(ctx, b.att, p)
	switch {
	case err == nil:
		ch := d.fileInode(ctx, p, info)
		ch.Operations().(*fileNode).attr(&out.Attr)
		return ch, 0
	case status.Code(err) != codes.NotFound && status.Code(err) != codes.InvalidArgument:
		return nil, errno(err)
	}
	isDir, err := b.isDir(ctx, p)
	if err != nil {
		return nil, errno(err)
	}
	if !isDir {
		return nil, syscall.ENOENT
	}
	b.dirAttr(&out.Attr)
	return d.NewInode(ctx, &dirNode{b: b, path: p}, fs.StableAttr{Mode: fuse.S_IFDIR, Ino: ino("d", p)}), 0
}

// fileInode returns the inode for the file at p, reusing a live one (and refreshing
// its metadata) so open handles and lookups agree.
func (d *dirNode) fileInode(ctx context.Context, p string, info *fabricv1.StorageObjectInfo) *fs.Inode {
	d.b.mu.Lock()
	ln := d.b.local[p]
	d.b.mu.Unlock()
	node := ln
	if node == nil {
		node = &fileNode{b: d.b, path: p}
	}
	ch := d.NewInode(ctx, node, fs.StableAttr{Mode: fuse.S_IFREG, Ino: ino("f", p)})
	if info != nil {
		ch.Operations().(*fileNode).setInfo(info)
	}
	return ch
}

// isDir reports whether p is a folder: made by mkdir, holding a file created here, or
// the prefix of at least one object.
func (b *bucketFS) isDir(ctx context.Context, p string) (bool, error) {
	b.mu.Lock()
	found := b.vdirs[p]
	if !found {
		for lp := range b.local {
			if strings.HasPrefix(lp, p+"/") {
				found = true
				break
			}
		}
	}
	b.mu.Unlock()
	if found {
		return true, nil
	}
	page, err := b.c.List(ctx, b.att, p+"/", "", "", 1)
	if err != nil {
		return false, err
	}
	return len(page.GetEntries()) > 0, nil
}

func (d *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	b := d.b
	prefix := ""
	if d.path != "" {
		prefix = d.path + "/"
	}
	files, dirs := map[string]bool{}, map[string]bool{}
	cursor := ""
	for {
		page, err := b.c.List(ctx, b.att, prefix, "/", cursor, 1000)
		if err != nil {
			return nil, errno(err)
		}
		for _, e := range page.GetEntries() {
			if name := strings.TrimPrefix(e.GetPath(), prefix); name != "" && !strings.Contains(name, "/") {
				files[name] = true
			}
		}
		for _, pr := range page.GetPrefixes() {
			if name := strings.TrimSuffix(strings.TrimPrefix(pr, prefix), "/"); name != "" && !strings.Contains(name, "/") {
				dirs[name] = true
			}
		}
		if cursor = page.GetNextCursor(); cursor == "" {
			break
		}
	}
	b.mu.Lock()
	for p := range b.local {
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			if first, _, deeper := strings.Cut(rest, "/"); deeper {
				dirs[first] = true
			} else {
				files[rest] = true
			}
		}
	}
	for p := range b.vdirs {
		if rest, ok := strings.CutPrefix(p, prefix); ok && rest != "" {
			first, _, _ := strings.Cut(rest, "/")
			dirs[first] = true
		}
	}
	b.mu.Unlock()
	entries := make([]fuse.DirEntry, 0, len(files)+len(dirs))
	for name := range dirs {
		// An object and a folder of the same name: the object wins (as in Lookup).
		if !files[name] {
			entries = append(entries, fuse.DirEntry{Name: name, Mode: fuse.S_IFDIR, Ino: ino("d", join(d.path, name))})
		}
	}
	for name := range files {
		entries = append(entries, fuse.DirEntry{Name: name, Mode: fuse.S_IFREG, Ino: ino("f", join(d.path, name))})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	return fs.NewListDirStream(entries), 0
}

func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !d.b.rw {
		return nil, syscall.EROFS
	}
	p, e := d.child(name)
	if e != 0 {
		return nil, e
	}
	if _, err := d.b.c.Stat(ctx, d.b.att, p); err == nil {
		return nil, syscall.EEXIST
	}
	d.b.mu.Lock()
	d.b.vdirs[p] = true
	d.b.mu.Unlock()
	d.b.dirAttr(&out.Attr)
	return d.NewInode(ctx, &dirNode{b: d.b, path: p}, fs.StableAttr{Mode: fuse.S_IFDIR, Ino: ino("d", p)}), 0
}

func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if !d.b.rw {
		return syscall.EROFS
	}
	p, e := d.child(name)
	if e != 0 {
		return e
	}
	b := d.b
	b.mu.Lock()
	_, wasVirtual := b.vdirs[p]
	busy := false
	for lp := range b.local {
		busy = busy || strings.HasPrefix(lp, p+"/")
	}
	for vp := range b.vdirs {
		busy = busy || strings.HasPrefix(vp, p+"/")
	}
	b.mu.Unlock()
	if busy {
		return syscall.ENOTEMPTY
	}
	page, err := b.c.List(ctx, b.att, p+"/", "", "", 1)
	if err != nil {
		return errno(err)
	}
	if len(page.GetEntries()) > 0 {
		return syscall.ENOTEMPTY
	}
	if !wasVirtual {
		return syscall.ENOENT
	}
	b.mu.Lock()
	delete(b.vdirs, p)
	b.mu.Unlock()
	return 0
}

func (d *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if !d.b.rw {
		return nil, nil, 0, syscall.EROFS
	}
	p, e := d.child(name)
	if e != 0 {
		return nil, nil, 0, e
	}
	b := d.b
	b.mu.Lock()
	node := b.local[p]
	if node == nil {
		node = &fileNode{b: b, path: p}
		b.local[p] = node
	}
	b.mu.Unlock()
	ch := d.NewInode(ctx, node, fs.StableAttr{Mode: fuse.S_IFREG, Ino: ino("f", p)})
	fn := ch.Operations().(*fileNode)
	if fn != node {
		// A live inode for p already existed (an object seen before): it takes the
		// local role.
		b.mu.Lock()
		b.local[p] = fn
		b.mu.Unlock()
	}
	h, e := fn.openWrite(ctx, true)
	if e != 0 {
		// Lock order: a fileNode's mu is never taken while holding the bucketFS's.
		if fn.isNew() {
			b.mu.Lock()
			if b.local[p] == fn {
				delete(b.local, p)
			}
			b.mu.Unlock()
		}
		return nil, nil, 0, e
	}
	fn.attr(&out.Attr)
	return ch, h, 0, 0
}

func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if !d.b.rw {
		return syscall.EROFS
	}
	p, e := d.child(name)
	if e != 0 {
		return e
	}
	b := d.b
	b.mu.Lock()
	ln := b.local[p]
	delete(b.local, p)
	b.mu.Unlock()
	err := b.c.Delete(ctx, b.att, p)
	if ln != nil && status.Code(err) == codes.NotFound {
		// Created here and never uploaded: gone once its handles close (discard keeps
		// a pending close from uploading it after all).
		ln.discard()
		return 0
	}
	if ln != nil {
		ln.discard()
	}
	return errno(err)
}

// Rename answers EXDEV: a bucket has no rename, and EXDEV makes mv(1) copy and delete,
// which is what a rename would have to do anyway.
func (d *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if !d.b.rw {
		return syscall.EROFS
	}
	return syscall.EXDEV
}

// ---------------------------------------------------------------------------------------
// Files

type fileNode struct {
	fs.Inode
	b    *bucketFS
	path string

	mu        sync.Mutex
	info      *fabricv1.StorageObjectInfo // nil: not in the bucket (yet)
	fetched   time.Time
	spool     *os.File // while open for writing: the whole content
	spoolRefs int
	dirty     bool // spool differs from the bucket
	discarded bool // unlinked while open: never upload
}

var (
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
)

func (f *fileNode) setInfo(info *fabricv1.StorageObjectInfo) {
	f.mu.Lock()
	f.info, f.fetched = info, time.Now()
	f.mu.Unlock()
}

func (f *fileNode) isNew() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.info == nil && f.spool == nil
}

func (f *fileNode) discard() {
	f.mu.Lock()
	f.discarded, f.dirty = true, false
	f.mu.Unlock()
}

func (f *fileNode) attr(a *fuse.Attr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attrLocked(a)
}

func (f *fileNode) attrLocked(a *fuse.Attr) {
	a.Mode = fuse.S_IFREG | f.b.fileMode()
	a.Nlink = 1
	a.Owner = fuse.Owner{Uid: f.b.uid, Gid: f.b.gid}
	a.Blksize = 128 << 10
	if f.info != nil {
		a.Size = uint64(f.info.GetSize())
		if t := f.info.GetUpdatedAt(); t != nil {
			tt := t.AsTime()
			a.SetTimes(&tt, &tt, &tt)
		}
	}
	if f.spool != nil {
		if st, err := f.spool.Stat(); err == nil {
			a.Size = uint64(st.Size())
			mt := st.ModTime()
			a.SetTimes(&mt, &mt, &mt)
		}
	}
	a.Blocks = (a.Size + 511) / 512
}

func (f *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.mu.Lock()
	stale := f.spool == nil && f.info != nil && time.Since(f.fetched) > attrFresh
	f.mu.Unlock()
	if stale {
		info, err := f.b.c.Stat(ctx, f.b.att, f.path)
		if err != nil {
			return errno(err)
		}
		f.setInfo(info)
	}
	f.attr(&out.Attr)
	return 0
}

// Setattr changes the size (truncate) of a rw file; mode, owner and time changes are
// accepted and not kept (the bucket stores none of them).
func (f *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !f.b.rw {
		return syscall.EROFS
	}
	if size, ok := in.GetSize(); ok {
		if h, isW := fh.(*writeHandle); isW {
			if e := h.truncate(int64(size)); e != 0 {
				return e
			}
		} else {
			// truncate(2) on a path: open, cut, upload, close.
			h, e := f.openWrite(ctx, size == 0)
			if e != 0 {
				return e
			}
			e = h.truncate(int64(size))
			if e == 0 {
				e = h.Flush(ctx)
			}
			h.Release(ctx)
			if e != 0 {
				return e
			}
		}
	}
	f.attr(&out.Attr)
	return 0
}

func (f *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	if write {
		if !f.b.rw {
			return nil, 0, syscall.EROFS
		}
		h, e := f.openWrite(ctx, flags&syscall.O_TRUNC != 0)
		return h, 0, e
	}
	f.mu.Lock()
	if f.spool != nil {
		// Someone is writing it: readers see the same bytes.
		f.spoolRefs++
		f.mu.Unlock()
		return &writeHandle{f: f, readOnly: true}, 0, 0
	}
	f.mu.Unlock()
	info, err := f.b.c.Stat(ctx, f.b.att, f.path)
	if err != nil {
		return nil, 0, errno(err)
	}
	f.setInfo(info)
	return newReadHandle(f, info.GetEtag(), info.GetSize()), 0, 0
}

// openWrite gives a handle on the file's spool, creating it (with the bucket's content
// unless truncate) when this is the first writer.
func (f *fileNode) openWrite(ctx context.Context, truncate bool) (*writeHandle, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.spool == nil {
		sp, err := os.CreateTemp(f.b.spoolDir, "spool-*")
		if err != nil {
			f.b.log.Error("storage: creating a spool file", "err", err)
			return nil, syscall.EIO
		}
		// The name is not needed: the open file is the spool, and nothing is left on
		// disk if the agent dies.
		_ = os.Remove(sp.Name())
		if !truncate && f.info != nil && f.info.GetSize() > 0 {
			r, err := f.b.c.Open(ctx, f.b.att, f.path, 0, 0, "")
			if err == nil {
				_, err = io.Copy(sp, r)
				_ = r.Close()
			}
			if err != nil {
				_ = sp.Close()
				return nil, errno(err)
			}
		}
		f.spool, f.dirty, f.discarded = sp, f.info == nil, false
	}
	if truncate {
		if err := f.spool.Truncate(0); err != nil {
			return nil, syscall.EIO
		}
		f.dirty = true
	}
	f.spoolRefs++
	return &writeHandle{f: f}, 0
}

// writeHandle reads and writes the spool; the bucket gets the content on flush.
type writeHandle struct {
	f        *fileNode
	readOnly bool
}

var (
	_ fs.FileReader   = (*writeHandle)(nil)
	_ fs.FileWriter   = (*writeHandle)(nil)
	_ fs.FileFlusher  = (*writeHandle)(nil)
	_ fs.FileFsyncer  = (*writeHandle)(nil)
	_ fs.FileReleaser = (*writeHandle)(nil)
)

func (h *writeHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	n, err := h.f.spool.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *writeHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if h.readOnly {
		return 0, syscall.EBADF
	}
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	n, err := h.f.spool.WriteAt(data, off)
	if n > 0 {
		h.f.dirty = true
	}
	if err != nil {
		return uint32(n), syscall.EIO
	}
	return uint32(n), 0
}

func (h *writeHandle) truncate(size int64) syscall.Errno {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if err := h.f.spool.Truncate(size); err != nil {
		return syscall.EIO
	}
	h.f.dirty = true
	return 0
}

// Flush uploads the spool when it changed: close(2) returns the upload's outcome, so a
// program learns about a full quota from its close.
func (h *writeHandle) Flush(ctx context.Context) syscall.Errno {
	return h.f.upload(ctx)
}

func (h *writeHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.f.upload(ctx)
}

// Release drops the spool with the last handle; content a failed flush could not
// upload gets one more try on the mount's own context (the program has gone).
func (h *writeHandle) Release(ctx context.Context) syscall.Errno {
	f := h.f
	f.mu.Lock()
	f.spoolRefs--
	last := f.spoolRefs == 0
	dirty := f.dirty
	f.mu.Unlock()
	if !last {
		return 0
	}
	if dirty {
		if e := f.upload(f.b.ctx); e != 0 {
			f.b.log.Error("storage: a closed file could not be uploaded; its changes are lost", "attachment_id", f.b.att, "path", f.path, "errno", e)
		}
	}
	f.mu.Lock()
	if f.spoolRefs == 0 && f.spool != nil {
		_ = f.spool.Close()
		f.spool = nil
	}
	// A file never uploaded (its upload failed) stops being listed with its last handle.
	forget := f.spoolRefs == 0
	f.mu.Unlock()
	if forget {
		f.b.mu.Lock()
		if f.b.local[f.path] == f {
			delete(f.b.local, f.path)
		}
		f.b.mu.Unlock()
	}
	return 0
}

// upload sends the spool as the object's new content when it is dirty. The spool is
// an open file, so an upload broken by a dropped tunnel starts over from its first byte.
func (f *fileNode) upload(ctx context.Context) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.dirty || f.spool == nil || f.discarded {
		return 0
	}
	st, err := f.spool.Stat()
	if err != nil {
		return syscall.EIO
	}
	info, err := uploadRetrying(ctx, f.b.c, f.b.att, f.path, func() (io.Reader, int64, error) {
		return io.NewSectionReader(f.spool, 0, st.Size()), st.Size(), nil
	})
	if err != nil {
		f.b.log.Warn("storage: upload failed", "attachment_id", f.b.att, "path", f.path, "err", err)
		return errno(err)
	}
	f.info, f.fetched, f.dirty = info, time.Now(), false
	f.b.mu.Lock()
	if f.spoolRefs == 0 && f.b.local[f.path] == f {
		delete(f.b.local, f.path)
	}
	f.b.mu.Unlock()
	return 0
}

// uploadRetrying writes an object from a source that can be read again from the start,
// retrying UNAVAILABLE (a dropped tunnel) within the client's RetryFor.
func uploadRetrying(ctx context.Context, c *Client, att, p string, src func() (io.Reader, int64, error)) (*fabricv1.StorageObjectInfo, error) {
	deadline := time.Now().Add(c.RetryFor)
	for {
		r, size, err := src()
		if err != nil {
			return nil, err
		}
		info, err := c.Write(ctx, att, p, r, size, mime.TypeByExtension(path.Ext(p)))
		if !retriable(ctx, err) || time.Now().After(deadline) {
			return info, err
		}
		t := time.NewTimer(c.Backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

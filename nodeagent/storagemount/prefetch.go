package storagemount

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Prefetch bounds for a file read through a FUSE attachment. A sequential reader is
// served from blocks fetched ahead of it, each block its own StorageFabric.Read stream,
// several in flight at once: one stream at a time left the tunnel idle between
// ranges and kept at most one stream's flow-control window moving, so the read ran at
// the pace of round trips rather than of bytes. Blocks grow from prefetchFirstBlock
// (a short read of a large file fetches little) to PrefetchBlock.
const (
	// PrefetchBlock is the largest range one block stream fetches.
	PrefetchBlock = 4 << 20
	// PrefetchBlocks is how many blocks one open file may hold, fetched or in flight
	// (the one being read included): with PrefetchBlock, at most 16 MiB per open file
	// (plus one block a read straddling two may add).
	PrefetchBlocks = 4
	// prefetchFirstBlock is the first block of a sequential run.
	prefetchFirstBlock = 1 << 20
)

// block is one prefetched range [start, end): its data arrives in chunks (the Read
// stream's messages, kept as they came), and the chunks before what the reader
// consumed are dropped as it goes.
type block struct {
	start, end int64
	base       int64    // offset of chunks[0]
	chunks     []*chunk // contiguous from base
	filled     int64    // next offset the stream yields (base + all chunk bytes)
	done       bool     // the stream ended (err says how; nil with filled < end: short object)
	err        error
	cancel     context.CancelFunc
}

// chunk is a piece of a block as its stream delivered it (Reader.Next), read-only once
// added. refs counts who holds it: the block, until the reader has passed it, and every
// FUSE reply sent straight from it (chunkReply), until go-fuse has written it to the
// kernel; the last one gives the buffer back (ReleaseChunk).
type chunk struct {
	b    []byte
	refs atomic.Int32
}

func newChunk(b []byte) *chunk {
	c := &chunk{b: b}
	c.refs.Store(1)
	return c
}

func (c *chunk) unref() {
	if c.refs.Add(-1) == 0 {
		ReleaseChunk(c.b)
	}
}

// chunkReply answers a FUSE read from a chunk without copying it into go-fuse's buffer:
// go-fuse writes Bytes to the kernel and then calls Done. A sequential read of 256 KiB
// (cat's, and the kernel's readahead) lies inside one 256 KiB chunk; copying every byte
// once more was 6 % of an attachment read's CPU (docs/storage.md).
type chunkReply struct {
	c    *chunk
	data []byte
}

func (r *chunkReply) Bytes([]byte) ([]byte, fuse.Status) { return r.data, fuse.OK }
func (r *chunkReply) Size() int                          { return len(r.data) }
func (r *chunkReply) Done()                              { r.c.unref() }

// readHandle serves reads of one open object. Sequential reads (each starting where
// the previous ended, or inside a block already held) come from the prefetched
// blocks; any other read drops them and fetches exactly its own bytes with one
// stream, so random access costs no readahead. Every stream is pinned to the etag seen
// at open, so a file replaced meanwhile fails with ESTALE instead of mixing versions,
// and every block is a new stream the control plane checks: a revoked attachment stops
// the file within the blocks already fetched.
type readHandle struct {
	f    *fileNode
	etag string
	size int64

	readMu sync.Mutex // one FUSE read at a time walks the blocks

	mu      sync.Mutex // guards the blocks (fetchers append under it)
	blocks  []*block   // ascending and contiguous
	changed chan struct{}
	next    int64 // where a sequential reader reads next
	streak  int   // sequential reads in a row
	closed  bool
}

var (
	_ fs.FileReader   = (*readHandle)(nil)
	_ fs.FileReleaser = (*readHandle)(nil)
)

func newReadHandle(f *fileNode, etag string, size int64) *readHandle {
	return &readHandle{f: f, etag: etag, size: size, changed: make(chan struct{})}
}

func (h *readHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.readMu.Lock()
	defer h.readMu.Unlock()
	end := min(off+int64(len(dest)), h.size)
	if off >= end {
		return fuse.ReadResultData(nil), 0
	}
	h.mu.Lock()
	sequential := off == h.next || h.holds(off)
	if !sequential {
		h.dropLocked()
		h.streak = 0
		h.mu.Unlock()
		n, e := h.direct(ctx, dest[:end-off], off)
		if e != 0 {
			return nil, e
		}
		h.mu.Lock()
		h.next = off + int64(n)
		h.mu.Unlock()
		return fuse.ReadResultData(dest[:n]), 0
	}
	h.streak++
	h.dropBeforeLocked(off)
	h.aheadLocked(off, end)
	if b := h.blockAtLocked(off); b != nil {
		if c, data := b.within(off, end); c != nil {
			c.refs.Add(1) // the reply's, given back by Done
			b.consume(end)
			h.next = end
			h.dropBeforeLocked(end)
			h.mu.Unlock()
			return &chunkReply{c: c, data: data}, 0
		}
	}
	h.mu.Unlock()

	filled := 0
	for pos := off; pos < end; {
		h.mu.Lock()
		b := h.blockAtLocked(pos)
		if b == nil {
			// Dropped under us (Release) or past a short object's end.
			h.mu.Unlock()
			break
		}
		if pos >= b.filled {
			if b.done {
				err := b.err
				h.mu.Unlock()
				if err != nil {
					h.mu.Lock()
					h.dropLocked()
					h.mu.Unlock()
					return nil, errno(err)
				}
				break // the object is shorter than it was at open
			}
			wait := h.changed
			h.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, syscall.EINTR
			}
			continue
		}
		n := b.copyOut(dest[filled:end-off], pos)
		filled += n
		pos += int64(n)
		b.consume(pos)
		h.mu.Unlock()
	}
	h.mu.Lock()
	h.next = off + int64(filled)
	h.dropBeforeLocked(h.next)
	h.mu.Unlock()
	return fuse.ReadResultData(dest[:filled]), 0
}

// direct reads exactly p at off with one stream (a random read).
func (h *readHandle) direct(ctx context.Context, p []byte, off int64) (int, syscall.Errno) {
	r, err := h.f.b.c.Open(ctx, h.f.b.att, h.f.path, off, int64(len(p)), h.etag)
	if err != nil {
		return 0, errno(err)
	}
	defer r.Close()
	n, err := io.ReadFull(r, p)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, errno(err)
	}
	return n, 0
}

// holds reports whether off lies in the data a block still keeps.
func (h *readHandle) holds(off int64) bool {
	return h.blockAtLocked(off) != nil
}

func (h *readHandle) blockAtLocked(off int64) *block {
	for _, b := range h.blocks {
		if off >= b.base && off < b.end {
			return b
		}
	}
	return nil
}

// aheadLocked starts the blocks that cover [off, end) and, for a sequential run, the
// ones after it, up to PrefetchBlocks held at once.
func (h *readHandle) aheadLocked(off, end int64) {
	if h.closed {
		return
	}
	from := off
	if n := len(h.blocks); n > 0 {
		from = h.blocks[n-1].end
	}
	// The run's length decides how far ahead: one block for a first read, more as it
	// goes on.
	want := min(PrefetchBlocks, h.streak)
	for from < h.size && (from < end || len(h.blocks) < want) {
		size := min(int64(prefetchFirstBlock)<<min(h.streak-1, 2), PrefetchBlock)
		if from < end {
			size = max(size, end-from)
		}
		b := &block{start: from, end: min(from+size, h.size), base: from, filled: from}
		ctx, cancel := context.WithCancel(h.f.b.ctx)
		b.cancel = cancel
		h.blocks = append(h.blocks, b)
		go h.fetch(ctx, b)
		from = b.end
	}
}

// fetch streams one block's range into it.
func (h *readHandle) fetch(ctx context.Context, b *block) {
	r, err := h.f.b.c.Open(ctx, h.f.b.att, h.f.path, b.start, b.end-b.start, h.etag)
	for err == nil {
		var data []byte
		data, err = r.Next()
		if len(data) > 0 {
			h.mu.Lock()
			b.chunks = append(b.chunks, newChunk(data))
			b.filled += int64(len(data))
			h.notifyLocked()
			h.mu.Unlock()
		}
	}
	if r != nil {
		_ = r.Close()
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	h.mu.Lock()
	b.done, b.err = true, err
	h.notifyLocked()
	h.mu.Unlock()
	b.cancel()
}

func (h *readHandle) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// within returns the chunk holding all of [off, end) and those bytes, or nil when no
// single chunk the block has holds them.
func (b *block) within(off, end int64) (*chunk, []byte) {
	at := b.base
	for _, c := range b.chunks {
		cend := at + int64(len(c.b))
		if off >= at && off < cend {
			if end > cend {
				return nil, nil
			}
			return c, c.b[off-at : end-at]
		}
		at = cend
	}
	return nil, nil
}

// copyOut copies what the block holds from pos into p.
func (b *block) copyOut(p []byte, pos int64) int {
	n := 0
	at := b.base
	for _, c := range b.chunks {
		cend := at + int64(len(c.b))
		if pos < cend && n < len(p) {
			k := copy(p[n:], c.b[pos-at:])
			n += k
			pos += int64(k)
		}
		at = cend
		if n == len(p) {
			break
		}
	}
	return n
}

// consume drops the chunks wholly before pos.
func (b *block) consume(pos int64) {
	for len(b.chunks) > 0 && b.base+int64(len(b.chunks[0].b)) <= pos {
		b.base += int64(len(b.chunks[0].b))
		b.chunks[0].unref()
		b.chunks[0] = nil
		b.chunks = b.chunks[1:]
	}
}

// dropBeforeLocked ends the blocks that end at or before off.
func (h *readHandle) dropBeforeLocked(off int64) {
	i := 0
	for i < len(h.blocks) && h.blocks[i].end <= off {
		h.blocks[i].cancel()
		i++
	}
	h.blocks = h.blocks[i:]
}

// dropLocked ends every block.
func (h *readHandle) dropLocked() {
	for _, b := range h.blocks {
		b.cancel()
	}
	h.blocks = nil
}

func (h *readHandle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	h.dropLocked()
	return 0
}

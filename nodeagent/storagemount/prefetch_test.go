package storagemount

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// prefetchHandle is a read handle on a synthetic object of the test StorageFabric server,
// without the kernel in between, so the test decides every offset and size the
// handle sees (through a mount the page cache would reshape them).
func prefetchHandle(t *testing.T, e *env, name string, size int64) *readHandle {
	t.Helper()
	c := NewClient(e.conns)
	c.RetryFor, c.Backoff = 10*time.Second, 10*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b := newBucketFS(ctx, c, attRO, false, 0, 0, t.TempDir(), slog.New(slog.DiscardHandler))
	f := &fileNode{b: b, path: name}
	info, err := c.Stat(ctx, attRO, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetSize() != size {
		t.Fatalf("size %d, want %d", info.GetSize(), size)
	}
	return newReadHandle(f, info.GetEtag(), info.GetSize())
}

func readAt(t *testing.T, h *readHandle, n int, off int64) []byte {
	t.Helper()
	res, e := h.Read(context.Background(), make([]byte, n), off)
	if e != 0 {
		t.Fatalf("read %d at %d: %v", n, off, e)
	}
	got, st := res.Bytes(make([]byte, n))
	if st != fuse.OK {
		t.Fatalf("read result: %v", st)
	}
	return got
}

// TestPrefetchRandomOffsets: reads of random offsets and sizes, mixed with sequential
// runs long enough to start the prefetch (and jumps inside, before and past the
// prefetched blocks), all give the object's bytes; the last read of the object
// ends at its size; streams never exceed the per-file bound, and Release ends them all.
func TestPrefetchRandomOffsets(t *testing.T) {
	for _, via := range []string{viaRaw, viaGRPC} {
		t.Run(via, func(t *testing.T) { testPrefetchRandomOffsets(t, via) })
	}
}

func testPrefetchRandomOffsets(t *testing.T, via string) {
	const size = 24<<20 + 12345 // not a multiple of any block or chunk
	e := newEnvVia(t, ModeCopy, via)
	e.store.putSynthetic("big.bin", size)
	e.store.breakReads = 3
	h := prefetchHandle(t, e, "big.bin", size)
	rng := rand.New(rand.NewPCG(20, 26))
	want := func(off int64, n int) []byte {
		n = int(min(int64(n), max(size-off, 0)))
		p := make([]byte, n)
		synthFill(p, off)
		return p
	}
	check := func(off int64, n int) {
		t.Helper()
		if got, w := readAt(t, h, n, off), want(off, n); !bytes.Equal(got, w) {
			t.Fatalf("read %d at %d: %d bytes, differ from the object's (want %d)", n, off, len(got), len(w))
		}
	}
	for range 40 {
		off := rng.Int64N(size + 1<<20) // sometimes past the end
		switch rng.IntN(3) {
		case 0: // one random read
			check(off, 1+rng.IntN(3<<20))
		case 1: // a sequential run: the prefetch starts and runs ahead
			n := 4096 + rng.IntN(1<<20)
			for range 2 + rng.IntN(12) {
				check(off, n)
				off += int64(n)
			}
			// then a jump a little back or ahead, maybe inside a held block
			check(max(off-int64(rng.IntN(2<<20))+int64(rng.IntN(6<<20)), 0), 1+rng.IntN(1<<20))
		case 2: // read to the end in 1 MiB requests, as the kernel's readahead asks
			for ; off < size; off += 1 << 20 {
				check(off, 1<<20)
			}
		}
	}
	e.store.mu.Lock()
	peak := e.store.readsPeak
	e.store.mu.Unlock()
	// The handle holds at most PrefetchBlocks blocks and one direct read; the server
	// counts a stream until its handler returns, which for a block the reader dropped is
	// a moment after the agent cancelled it. Under load (make test) the next block's
	// stream was seen starting inside that moment once, so one stream whose cancel is
	// still on its way is allowed; a prefetch that ran away would still show here.
	if peak > PrefetchBlocks+2 {
		t.Fatalf("%d read streams at once, bound %d (and one still being cancelled)", peak, PrefetchBlocks+1)
	}
	h.Release(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.store.mu.Lock()
		live := e.store.readsLive
		e.store.mu.Unlock()
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d read streams still served after Release", live)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("peak %d streams at once", peak)
}

// TestPrefetchStopsOnRevocation: once the control plane stops serving the attachment
// (detached, or the grant behind it revoked), a file being read sequentially fails
// with EACCES within the blocks already fetched, instead of streaming on.
func TestPrefetchStopsOnRevocation(t *testing.T) {
	for _, via := range []string{viaRaw, viaGRPC} {
		t.Run(via, func(t *testing.T) { testPrefetchStopsOnRevocation(t, via) })
	}
}

func testPrefetchStopsOnRevocation(t *testing.T, via string) {
	const size = 64 << 20
	e := newEnvVia(t, ModeCopy, via)
	e.store.putSynthetic("big.bin", size)
	h := prefetchHandle(t, e, "big.bin", size)
	off := int64(0)
	for ; off < 8<<20; off += 1 << 20 {
		readAt(t, h, 1<<20, off)
	}
	e.store.mu.Lock()
	delete(e.store.attachments, attRO)
	e.store.mu.Unlock()
	for ; off < size; off += 1 << 20 {
		_, errno := h.Read(context.Background(), make([]byte, 1<<20), off)
		if errno == syscall.EACCES {
			if limit := int64(8<<20 + (PrefetchBlocks+1)*PrefetchBlock); off > limit {
				t.Fatalf("revocation seen at %d MiB, after more than the prefetch bound", off>>20)
			}
			return
		}
		if errno != 0 {
			t.Fatalf("read at %d: %v, want EACCES", off, errno)
		}
	}
	t.Fatal("the whole file was read after the attachment was revoked")
}

// TestFUSEPrefetchThroughMount: the same object read through a real mount with
// sequential reads and pread(2) at random offsets gives the object's bytes.
func TestFUSEPrefetchThroughMount(t *testing.T) {
	requireFUSE(t)
	const size = 24<<20 + 777
	e := newEnv(t, ModeFUSE)
	e.store.putSynthetic("big.bin", size)
	dir := e.attach(payload(attRO, alloctask.StorageModeRO))
	f, err := os.Open(filepath.Join(dir, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(7, 11))
	for range 100 {
		off := rng.Int64N(size)
		n := 1 + rng.IntN(2<<20)
		got := make([]byte, n)
		k, err := f.ReadAt(got, off)
		if err != nil && k != int(size-off) {
			t.Fatalf("pread %d at %d: %d, %v", n, off, k, err)
		}
		w := make([]byte, k)
		synthFill(w, off)
		if !bytes.Equal(got[:k], w) {
			t.Fatalf("pread %d at %d: bytes differ from the object's", n, off)
		}
	}
}

// TestChunkRepliesHoldTheirChunk: a sequential read that lies inside one prefetched
// chunk is answered from the chunk itself, with the object's bytes, and the chunk stays
// the reply's (not back in the pool for the next block to overwrite) until go-fuse calls
// Done, however far the reader has moved on meanwhile; Done gives it back.
func TestChunkRepliesHoldTheirChunk(t *testing.T) {
	const size = 8 << 20
	e := newEnvVia(t, ModeCopy, viaRaw)
	e.store.putSynthetic("big.bin", size)
	h := prefetchHandle(t, e, "big.bin", size)
	// filled waits (bounded) until a held block has the bytes before end.
	filled := func(end int64) {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			h.mu.Lock()
			b := h.blockAtLocked(end - 1)
			ok := b == nil || b.filled >= end
			h.mu.Unlock()
			if ok {
				return
			}
		}
	}
	type held struct {
		r   *chunkReply
		off int64
	}
	var replies []held
	for off := int64(0); off < 4<<20; off += rawChunk {
		filled(off + rawChunk)
		res, errno := h.Read(context.Background(), make([]byte, rawChunk), off)
		if errno != 0 {
			t.Fatalf("read at %d: %v", off, errno)
		}
		if r, ok := res.(*chunkReply); ok {
			replies = append(replies, held{r, off})
			continue
		}
		got, _ := res.Bytes(make([]byte, rawChunk))
		want := make([]byte, rawChunk)
		synthFill(want, off)
		if !bytes.Equal(got, want) {
			t.Fatalf("copied read at %d: bytes differ from the object's", off)
		}
	}
	if len(replies) < 8 {
		t.Fatalf("%d of 16 chunk-aligned sequential reads answered from their chunk, want >= 8", len(replies))
	}
	for _, r := range replies {
		got, st := r.r.Bytes(nil)
		want := make([]byte, rawChunk)
		synthFill(want, r.off)
		if st != fuse.OK || r.r.Size() != rawChunk || !bytes.Equal(got, want) {
			t.Fatalf("reply at %d: %d bytes, differ from the object's", r.off, len(got))
		}
		// The reader is past this chunk: the block let go of it, the reply has not.
		if n := r.r.c.refs.Load(); n != 1 {
			t.Fatalf("chunk of the reply at %d held %d times before Done, want 1 (the reply)", r.off, n)
		}
		r.r.Done()
		if n := r.r.c.refs.Load(); n != 0 {
			t.Fatalf("chunk of the reply at %d held %d times after Done, want 0", r.off, n)
		}
	}
	h.Release(context.Background())
}

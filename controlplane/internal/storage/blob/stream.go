package blob

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"sync"
)

// BufferSize is the copy buffer for every streamed object: large enough that a 1 GiB
// object moves in 1,024 system calls per side, small enough that many concurrent uploads
// stay far from the control plane's memory budget.
const BufferSize = 1 << 20

var buffers = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}

// Copy copies src to dst through a pooled BufferSize buffer, bypassing ReaderFrom and
// WriterTo so the buffer size (not a 32 KiB default) decides the system call size.
func Copy(dst io.Writer, src io.Reader) (int64, error) {
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	return io.CopyBuffer(writerOnly{dst}, readerOnly{src}, *bp)
}

type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }

// intake is the reader a driver consumes during Put: it hashes and counts the bytes,
// stops at the first sign of ctx ending, and enforces a known size so that a mismatch
// surfaces as an error inside the stream, before the backend can commit the object.
type intake struct {
	ctx  context.Context
	src  io.Reader
	size int64 // -1: unknown
	n    int64
	h    hash.Hash
	err  error // sticky: once failed, every Read fails the same way
}

func newIntake(ctx context.Context, src io.Reader, size int64) *intake {
	return &intake{ctx: ctx, src: src, size: size, h: sha256.New()}
}

func (in *intake) Read(p []byte) (int, error) {
	if in.err != nil {
		return 0, in.err
	}
	if err := in.ctx.Err(); err != nil {
		return 0, in.fail(err)
	}
	if in.size >= 0 {
		left := in.size - in.n
		if left == 0 {
			if err := in.probeEnd(); err != nil {
				return 0, in.fail(err)
			}
			return 0, io.EOF
		}
		if int64(len(p)) > left {
			p = p[:left]
		}
	}
	n, err := in.src.Read(p)
	in.n += int64(n)
	in.h.Write(p[:n])
	switch {
	case err == io.EOF:
		if in.size >= 0 && in.n < in.size {
			return 0, in.fail(fmt.Errorf("%w: got %d bytes, declared %d", ErrSizeMismatch, in.n, in.size))
		}
		return n, io.EOF
	case err != nil:
		return 0, in.fail(err)
	}
	if in.size >= 0 && in.n == in.size {
		// Look for a byte beyond the declared size now, while the consumer still waits
		// for these last bytes: a backend that stops reading at exactly size bytes
		// would otherwise commit a truncated object.
		if err := in.probeEnd(); err != nil {
			return 0, in.fail(err)
		}
	}
	return n, nil
}

// probeEnd checks that the source has nothing after the declared size.
func (in *intake) probeEnd() error {
	var one [1]byte
	for range 100 {
		n, err := in.src.Read(one[:])
		if n > 0 {
			return fmt.Errorf("%w: more than the declared %d bytes", ErrSizeMismatch, in.size)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return io.ErrNoProgress
}

func (in *intake) fail(err error) error {
	in.err = err
	return err
}

// streamErr is the stream's own failure (the reader's error, ErrSizeMismatch found while
// reading, the context ending), which explains a failed Put better than the backend's
// report of it; nil when the stream itself was fine.
func (in *intake) streamErr() error {
	if in.err != nil {
		return in.err
	}
	return in.ctx.Err()
}

// done reports the error that should end a Put whose consumer finished without error: the
// stream's own, or a length that does not match the declared size.
func (in *intake) done() error {
	if err := in.streamErr(); err != nil {
		return err
	}
	if in.size >= 0 && in.n != in.size {
		return fmt.Errorf("%w: got %d bytes, declared %d", ErrSizeMismatch, in.n, in.size)
	}
	return nil
}

func (in *intake) result() PutResult {
	return PutResult{Size: in.n, SHA256: hex.EncodeToString(in.h.Sum(nil))}
}

// Pattern returns a reader of n deterministic pseudo-random bytes (ChaCha8 keyed by
// seed) produced on the fly: benchmarks and tests stream gigabytes through a driver
// without holding them. The bytes do not compress or deduplicate, so no backend can
// flatter a benchmark, and generating them (several GB/s) is far faster than any disk.
// The stream does not depend on how it is read: any chunking gives the same bytes.
func Pattern(n int64, seed uint64) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	return io.LimitReader(rand.NewChaCha8(key), n)
}

// PutPattern puts Pattern(n, seed) at key with its size declared: the write side of a
// benchmark baseline (the same bytes a benchmark sends through the API).
func PutPattern(ctx context.Context, d Driver, key string, n int64, seed uint64) (PutResult, error) {
	return d.Put(ctx, key, Pattern(n, seed), n)
}

// Drain reads the whole object at key into io.Discard through one pooled BufferSize
// buffer and returns its length: the read side of a benchmark baseline.
func Drain(ctx context.Context, d Driver, key string) (int64, error) {
	rc, err := d.Open(ctx, key, 0, -1)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return Copy(io.Discard, rc)
}

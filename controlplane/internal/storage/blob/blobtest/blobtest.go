// Package blobtest is the conformance suite every blob.Driver passes: what the object
// store above relies on, checked against the real backend (a directory through os.Root, a
// real S3 server). A driver must also implement blob.Inventory, so that "nothing is left
// behind" is checked, not assumed.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
)

// MiB is a mebibyte.
const MiB = 1 << 20

// multipart is larger than the S3 driver's part size, so both of its upload paths (one
// PUT, multipart) are exercised by the same cases.
const multipart = blob.S3PartSize + 3*MiB + 7

// Run runs the suite; newDriver returns a driver on an empty store of its own (a fresh
// directory, a fresh bucket) and arranges its cleanup.
func Run(t *testing.T, newDriver func(t *testing.T) blob.Driver) {
	open := func(t *testing.T) blob.Driver {
		d := newDriver(t)
		if _, ok := d.(blob.Inventory); !ok {
			t.Fatalf("%T does not implement blob.Inventory", d)
		}
		if _, ok := d.(blob.TempSweeper); !ok {
			t.Fatalf("%T does not implement blob.TempSweeper", d)
		}
		if err := d.Check(ctxFor(t)); err != nil {
			t.Fatalf("Check of a fresh store: %v", err)
		}
		return d
	}
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, open(t)) })
	t.Run("UnknownSize", func(t *testing.T) { testUnknownSize(t, open(t)) })
	t.Run("Empty", func(t *testing.T) { testEmpty(t, open(t)) })
	t.Run("SizeMismatch", func(t *testing.T) { testSizeMismatch(t, open(t)) })
	t.Run("ReaderError", func(t *testing.T) { testReaderError(t, open(t)) })
	t.Run("ContextCanceled", func(t *testing.T) { testContextCanceled(t, open(t)) })
	t.Run("Ranges", func(t *testing.T) { testRanges(t, open(t)) })
	t.Run("Overwrite", func(t *testing.T) { testOverwrite(t, open(t)) })
	t.Run("DeleteAndNotFound", func(t *testing.T) { testDelete(t, open(t)) })
	t.Run("InvalidKey", func(t *testing.T) { testInvalidKey(t, open(t)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, open(t)) })
	t.Run("Large", func(t *testing.T) { testLarge(t, open(t)) })
	t.Run("SweepStaleTemps", func(t *testing.T) { testSweep(t, open(t)) })
}

// NewKey is a fresh version key, shaped as the store makes them.
func NewKey() string {
	return blob.Key(uuid.New(), uuid.New(), uuid.New(), uuid.New())
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// patternSum is the size and sha256 of blob.Pattern(n, seed), computed by streaming it.
func patternSum(n int64, seed uint64) string {
	h := sha256.New()
	if _, err := io.Copy(h, blob.Pattern(n, seed)); err != nil {
		panic(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// readSum reads the whole object back, streaming, and returns its size and sha256.
func readSum(t *testing.T, d blob.Driver, key string) (int64, string) {
	t.Helper()
	rc, err := d.Open(ctxFor(t), key, 0, -1)
	if err != nil {
		t.Fatalf("Open(%s): %v", key, err)
	}
	defer rc.Close()
	h := sha256.New()
	n, err := blob.Copy(h, rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return n, hex.EncodeToString(h.Sum(nil))
}

func inventory(t *testing.T, d blob.Driver) []string {
	t.Helper()
	names, err := d.(blob.Inventory).Inventory(ctxFor(t))
	if err != nil {
		t.Fatalf("Inventory: %v", err)
	}
	return names
}

// wantInventory fails unless the backend holds exactly keys (complete objects) and
// nothing else: no temp file, no unfinished upload.
func wantInventory(t *testing.T, d blob.Driver, keys ...string) {
	t.Helper()
	got := inventory(t, d)
	want := slices.Clone(keys)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("backend holds %q, want exactly %q", got, want)
	}
}

func wantNotFound(t *testing.T, d blob.Driver, key string) {
	t.Helper()
	if _, err := d.Stat(ctxFor(t), key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat(%s) = %v, want ErrNotFound", key, err)
	}
	if rc, err := d.Open(ctxFor(t), key, 0, -1); !errors.Is(err, blob.ErrNotFound) {
		if rc != nil {
			rc.Close()
		}
		t.Fatalf("Open(%s) = %v, want ErrNotFound", key, err)
	}
}

func put(t *testing.T, d blob.Driver, key string, r io.Reader, size int64) blob.PutResult {
	t.Helper()
	res, err := d.Put(ctxFor(t), key, r, size)
	if err != nil {
		t.Fatalf("Put(%s, size %d): %v", key, size, err)
	}
	return res
}

func testRoundTrip(t *testing.T, d blob.Driver) {
	for _, n := range []int64{1, 3*MiB + 17, multipart} {
		data, _ := io.ReadAll(blob.Pattern(n, uint64(n)))
		key := NewKey()
		res := put(t, d, key, bytes.NewReader(data), n)
		if res.Size != n || res.SHA256 != sum(data) {
			t.Fatalf("Put of %d bytes = %+v, want size %d sha256 %s", n, res, n, sum(data))
		}
		info, err := d.Stat(ctxFor(t), key)
		if err != nil || info.Size != n {
			t.Fatalf("Stat = %+v, %v; want size %d", info, err, n)
		}
		rc, err := d.Open(ctxFor(t), key, 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back %d bytes (%v), want the %d put", len(got), err, n)
		}
		wantInventory(t, d, key)
		if err := d.Delete(ctxFor(t), key); err != nil {
			t.Fatal(err)
		}
	}
}

func testUnknownSize(t *testing.T, d blob.Driver) {
	var keys []string
	for _, n := range []int64{5, 2 * MiB, multipart, 2*blob.S3PartSize + 1} {
		key := NewKey()
		keys = append(keys, key)
		// Pattern is a plain reader: the driver cannot learn its length.
		res := put(t, d, key, blob.Pattern(n, 7), -1)
		want := patternSum(n, 7)
		if res.Size != n || res.SHA256 != want {
			t.Fatalf("Put(-1) of %d bytes = %+v, want %s", n, res, want)
		}
		if gotN, gotSum := readSum(t, d, key); gotN != n || gotSum != want {
			t.Fatalf("read back %d bytes %s, want %d %s", gotN, gotSum, n, want)
		}
	}
	wantInventory(t, d, keys...)
}

func testEmpty(t *testing.T, d blob.Driver) {
	const emptySum = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	for _, size := range []int64{0, -1} {
		key := NewKey()
		res := put(t, d, key, bytes.NewReader(nil), size)
		if res.Size != 0 || res.SHA256 != emptySum {
			t.Fatalf("Put of nothing (size %d) = %+v", size, res)
		}
		if info, err := d.Stat(ctxFor(t), key); err != nil || info.Size != 0 {
			t.Fatalf("Stat = %+v, %v", info, err)
		}
		if n, s := readSum(t, d, key); n != 0 || s != emptySum {
			t.Fatalf("read back %d bytes", n)
		}
		for _, r := range [][2]int64{{0, 5}, {0, 0}} {
			rc, err := d.Open(ctxFor(t), key, r[0], r[1])
			if err != nil {
				t.Fatalf("Open(%d, %d) of an empty object: %v", r[0], r[1], err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if len(b) != 0 {
				t.Fatalf("Open(%d, %d) of an empty object gave %d bytes", r[0], r[1], len(b))
			}
		}
		if rc, err := d.Open(ctxFor(t), key, 1, -1); !errors.Is(err, blob.ErrInvalidRange) {
			if rc != nil {
				rc.Close()
			}
			t.Fatalf("Open(1, -1) of an empty object = %v, want ErrInvalidRange", err)
		}
		if err := d.Delete(ctxFor(t), key); err != nil {
			t.Fatal(err)
		}
	}
	wantInventory(t, d)
}

func testSizeMismatch(t *testing.T, d blob.Driver) {
	for _, tc := range []struct {
		name           string
		declared, sent int64
	}{
		{"shorter", MiB, MiB / 2},
		{"nothing", 10, 0},
		{"one byte longer", MiB, MiB + 1},
		{"much longer", 10, 3 * MiB},
		{"shorter multipart", multipart, multipart - 1},
		{"longer multipart", multipart, multipart + 1},
		{"short of a part boundary", blob.S3PartSize + 1, blob.S3PartSize},
	} {
		key := NewKey()
		_, err := d.Put(ctxFor(t), key, blob.Pattern(tc.sent, 3), tc.declared)
		if !errors.Is(err, blob.ErrSizeMismatch) {
			t.Fatalf("%s: Put declared %d, sent %d = %v, want ErrSizeMismatch", tc.name, tc.declared, tc.sent, err)
		}
		wantNotFound(t, d, key)
		wantInventory(t, d)
	}
	// A failed Put does not disturb what the key held before.
	key := NewKey()
	old := put(t, d, key, blob.Pattern(1000, 1), 1000)
	if _, err := d.Put(ctxFor(t), key, blob.Pattern(999, 2), 1000); !errors.Is(err, blob.ErrSizeMismatch) {
		t.Fatalf("failed overwrite = %v, want ErrSizeMismatch", err)
	}
	if n, s := readSum(t, d, key); n != 1000 || s != old.SHA256 {
		t.Fatalf("after a failed overwrite the key holds %d bytes %s, want the old %s", n, s, old.SHA256)
	}
	wantInventory(t, d, key)
}

var errBoom = errors.New("client went away")

// failingReader gives n bytes of Pattern and then fails with err (calling before first,
// if set, when it gets there).
type failingReader struct {
	r      io.Reader
	left   int64
	err    error
	before func()
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.left <= 0 {
		if f.before != nil {
			f.before()
			f.before = nil
			// Keep giving bytes: the driver must notice the context itself.
			return f.r.Read(p)
		}
		return 0, f.err
	}
	if int64(len(p)) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= int64(n)
	return n, err
}

func testReaderError(t *testing.T, d blob.Driver) {
	for _, tc := range []struct {
		name       string
		after      int64
		size       int64
		endOfBytes int64
	}{
		{"first read", 0, MiB, MiB},
		{"mid-stream known size", 3 * MiB, 8 * MiB, 8 * MiB},
		{"mid-stream unknown size", 3 * MiB, -1, 8 * MiB},
		{"after a part, known size", blob.S3PartSize + MiB, multipart + 8*MiB, multipart + 8*MiB},
		{"after a part, unknown size", blob.S3PartSize + MiB, -1, multipart + 8*MiB},
	} {
		key := NewKey()
		r := &failingReader{r: blob.Pattern(tc.endOfBytes, 4), left: tc.after, err: errBoom}
		_, err := d.Put(ctxFor(t), key, r, tc.size)
		if !errors.Is(err, errBoom) {
			t.Fatalf("%s: Put = %v, want the reader's error", tc.name, err)
		}
		wantNotFound(t, d, key)
		wantInventory(t, d)
	}
}

func testContextCanceled(t *testing.T, d blob.Driver) {
	for _, tc := range []struct {
		name  string
		after int64
		size  int64
	}{
		{"known size", 2 * MiB, 8 * MiB},
		{"unknown size", 2 * MiB, -1},
		{"after a part, unknown size", blob.S3PartSize + MiB, -1},
		{"after a part, known size", blob.S3PartSize + MiB, 3 * blob.S3PartSize},
	} {
		ctx, cancel := context.WithCancel(ctxFor(t))
		key := NewKey()
		r := &failingReader{r: blob.Pattern(1<<40, 5), left: tc.after, err: errBoom, before: cancel}
		_, err := d.Put(ctx, key, r, tc.size)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Put = %v, want context.Canceled", tc.name, err)
		}
		wantNotFound(t, d, key)
		wantInventory(t, d)
	}
	// A context that has already ended writes nothing at all.
	ctx, cancel := context.WithCancel(ctxFor(t))
	cancel()
	key := NewKey()
	if _, err := d.Put(ctx, key, blob.Pattern(10, 1), 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with an ended context = %v, want context.Canceled", err)
	}
	wantNotFound(t, d, key)
	wantInventory(t, d)
}

func testRanges(t *testing.T, d blob.Driver) {
	const size = 1000
	data, _ := io.ReadAll(blob.Pattern(size, 9))
	key := NewKey()
	put(t, d, key, bytes.NewReader(data), size)
	for _, tc := range []struct {
		off, n int64
		want   []byte
	}{
		{0, 10, data[:10]},
		{0, 1, data[:1]},
		{500, 100, data[500:600]},
		{990, -1, data[990:]},
		{1, -1, data[1:]},
		{0, -1, data},
		{0, size, data},
		{995, 10, data[995:]}, // runs past the end: cut there
		{0, 1 << 40, data},
		{999, 1, data[999:]},
		{size, -1, nil}, // starts at the end: empty
		{size, 5, nil},
		{size, 0, nil},
		{0, 0, nil},
		{500, 0, nil},
	} {
		rc, err := d.Open(ctxFor(t), key, tc.off, tc.n)
		if err != nil {
			t.Fatalf("Open(%d, %d): %v", tc.off, tc.n, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, tc.want) {
			t.Fatalf("Open(%d, %d) gave %d bytes (%v), want %d", tc.off, tc.n, len(got), err, len(tc.want))
		}
	}
	for _, r := range [][2]int64{{size + 1, -1}, {size + 1, 1}, {1 << 40, 10}, {-1, 5}, {0, -2}} {
		rc, err := d.Open(ctxFor(t), key, r[0], r[1])
		if !errors.Is(err, blob.ErrInvalidRange) {
			if rc != nil {
				rc.Close()
			}
			t.Fatalf("Open(%d, %d) = %v, want ErrInvalidRange", r[0], r[1], err)
		}
	}
	absent := NewKey()
	if _, err := d.Open(ctxFor(t), absent, 10, 5); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("ranged Open of an absent key = %v, want ErrNotFound", err)
	}
	if _, err := d.Open(ctxFor(t), absent, 0, 0); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("empty-range Open of an absent key = %v, want ErrNotFound", err)
	}
}

func testOverwrite(t *testing.T, d blob.Driver) {
	key := NewKey()
	put(t, d, key, blob.Pattern(3*MiB, 1), 3*MiB)
	res := put(t, d, key, blob.Pattern(1000, 2), -1)
	if n, s := readSum(t, d, key); n != 1000 || s != res.SHA256 || s != patternSum(1000, 2) {
		t.Fatalf("after overwrite the key holds %d bytes %s, want the second put", n, s)
	}
	if info, err := d.Stat(ctxFor(t), key); err != nil || info.Size != 1000 {
		t.Fatalf("Stat after overwrite = %+v, %v", info, err)
	}
	wantInventory(t, d, key)
}

func testDelete(t *testing.T, d blob.Driver) {
	absent := NewKey()
	wantNotFound(t, d, absent)
	if err := d.Delete(ctxFor(t), absent); err != nil {
		t.Fatalf("Delete of an absent key: %v", err)
	}
	key, other := NewKey(), NewKey()
	put(t, d, key, blob.Pattern(10, 1), 10)
	put(t, d, other, blob.Pattern(10, 2), 10)
	if err := d.Delete(ctxFor(t), key); err != nil {
		t.Fatal(err)
	}
	wantNotFound(t, d, key)
	if err := d.Delete(ctxFor(t), key); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if n, _ := readSum(t, d, other); n != 10 {
		t.Fatalf("Delete of one key disturbed another")
	}
	wantInventory(t, d, other)
}

func testInvalidKey(t *testing.T, d blob.Driver) {
	for _, key := range []string{"", "/abs", "../x", "a/../b", "a/./b", "a//b", "a/", "a/.put-x", ".hidden", "a\\b", "a/b c", "a/\x00"} {
		if _, err := d.Put(ctxFor(t), key, blob.Pattern(1, 1), 1); !errors.Is(err, blob.ErrInvalidKey) {
			t.Fatalf("Put(%q) = %v, want ErrInvalidKey", key, err)
		}
		if _, err := d.Open(ctxFor(t), key, 0, -1); !errors.Is(err, blob.ErrInvalidKey) {
			t.Fatalf("Open(%q) = %v, want ErrInvalidKey", key, err)
		}
		if _, err := d.Stat(ctxFor(t), key); !errors.Is(err, blob.ErrInvalidKey) {
			t.Fatalf("Stat(%q) = %v, want ErrInvalidKey", key, err)
		}
		if err := d.Delete(ctxFor(t), key); !errors.Is(err, blob.ErrInvalidKey) {
			t.Fatalf("Delete(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	wantInventory(t, d)
}

func testConcurrent(t *testing.T, d blob.Driver) {
	const writers = 8
	keys := make([]string, writers)
	errs := make([]error, writers)
	results := make([]blob.PutResult, writers)
	var wg sync.WaitGroup
	for i := range writers {
		keys[i] = NewKey()
		wg.Add(1)
		go func() {
			defer wg.Done()
			size := int64(2*MiB + i)
			if i%2 == 1 {
				size = -1
			}
			results[i], errs[i] = d.Put(ctxFor(t), keys[i], blob.Pattern(int64(2*MiB+i), uint64(100+i)), size)
		}()
	}
	wg.Wait()
	for i := range writers {
		if errs[i] != nil {
			t.Fatalf("writer %d: %v", i, errs[i])
		}
		want := patternSum(int64(2*MiB+i), uint64(100+i))
		if n, s := readSum(t, d, keys[i]); n != int64(2*MiB+i) || s != want || results[i].SHA256 != want {
			t.Fatalf("writer %d: read back %d bytes %s, Put said %s, want %s", i, n, s, results[i].SHA256, want)
		}
	}
	wantInventory(t, d, keys...)
}

// testLarge streams 64 MiB each way from a generator: the test holds no more than a
// buffer of it, so a driver that buffered the whole object would be the only one to.
func testLarge(t *testing.T, d blob.Driver) {
	const n = 64 * MiB
	want := patternSum(n, 42)
	for _, size := range []int64{n, -1} {
		key := NewKey()
		var res blob.PutResult
		var err error
		if size == n {
			res, err = blob.PutPattern(ctxFor(t), d, key, n, 42)
		} else {
			res, err = d.Put(ctxFor(t), key, blob.Pattern(n, 42), -1)
		}
		if err != nil || res.Size != n || res.SHA256 != want {
			t.Fatalf("Put of 64 MiB (size %d) = %+v, %v", size, res, err)
		}
		if got, err := blob.Drain(ctxFor(t), d, key); err != nil || got != n {
			t.Fatalf("Drain = %d, %v", got, err)
		}
		if gotN, gotSum := readSum(t, d, key); gotN != n || gotSum != want {
			t.Fatalf("read back %d bytes %s, want %s", gotN, gotSum, want)
		}
		// A tail range of a large object, as a resumed download asks for.
		rc, err := d.Open(ctxFor(t), key, n-MiB-3, -1)
		if err != nil {
			t.Fatal(err)
		}
		tail, _ := io.ReadAll(rc)
		rc.Close()
		exp := make([]byte, MiB+3)
		src := blob.Pattern(n, 42)
		if _, err := io.CopyN(io.Discard, src, n-MiB-3); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(src, exp); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tail, exp) {
			t.Fatalf("tail range of %d bytes differs", len(tail))
		}
		if err := d.Delete(ctxFor(t), key); err != nil {
			t.Fatal(err)
		}
	}
	wantInventory(t, d)
}

// partialPut starts a Put of unknown size whose reader has given some bytes and then
// waits, and returns once the backend shows the partial write (a temp file, an unfinished
// upload). Writing to w continues it; closing w ends it.
func partialPut(t *testing.T, d blob.Driver, key string) (w *io.PipeWriter, result <-chan error) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := d.Put(ctxFor(t), key, pr, -1)
		pr.CloseWithError(err)
		done <- err
	}()
	// Returns once the driver has read the bytes, so after it made its temp file or
	// started its upload.
	if _, err := pw.Write(make([]byte, 1000)); err != nil {
		t.Fatalf("the Put stopped reading: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for len(inventory(t, d)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a Put in progress left no trace in Inventory")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return pw, done
}

func testSweep(t *testing.T, d blob.Driver) {
	sw := d.(blob.TempSweeper)
	kept := NewKey()
	put(t, d, kept, blob.Pattern(10, 1), 10)

	// A cutoff before the Put began leaves it alone, and it completes.
	key := NewKey()
	w, done := partialPut(t, d, key)
	if n, err := sw.RemoveStaleTemps(ctxFor(t), time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("RemoveStaleTemps before the Put began = %d, %v; want 0", n, err)
	}
	w.Close()
	if err := <-done; err != nil {
		t.Fatalf("the Put after a sweep that spared it: %v", err)
	}
	if info, err := d.Stat(ctxFor(t), key); err != nil || info.Size != 1000 {
		t.Fatalf("Stat = %+v, %v", info, err)
	}

	// A cutoff after it began removes the partial write (as after a crash): the Put
	// then fails and still nothing is left; complete objects are never touched.
	lost := NewKey()
	w, done = partialPut(t, d, lost)
	if n, err := sw.RemoveStaleTemps(ctxFor(t), time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("RemoveStaleTemps after the Put began = %d, %v; want 1", n, err)
	}
	w.Close()
	if err := <-done; err == nil {
		t.Fatal("a Put whose partial write was swept succeeded")
	}
	wantNotFound(t, d, lost)
	wantInventory(t, d, kept, key)
}

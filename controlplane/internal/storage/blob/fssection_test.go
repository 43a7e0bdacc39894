package blob_test

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
)

// TestFSFileSection: the fs driver's reader names the file and the very section Open was
// asked for, and reading that section straight from the file (what sendfile does) gives
// the same bytes as reading the reader.
func TestFSFileSection(t *testing.T) {
	d := newFS(t)
	ctx := context.Background()
	key := blob.Key(uuid.New(), uuid.New(), uuid.New(), uuid.New())
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if _, err := d.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ off, n, want int64 }{{0, -1, int64(len(data))}, {5, 10, 10}, {1 << 20, -1, int64(len(data)) - 1<<20}, {int64(len(data)), -1, 0}} {
		rc, err := d.Open(ctx, key, c.off, c.n)
		if err != nil {
			t.Fatal(err)
		}
		fs, ok := rc.(blob.FileSection)
		if !ok {
			t.Fatalf("the fs driver's reader %T is no FileSection", rc)
		}
		f, off, n := fs.FileSection()
		if off != c.off || n != c.want {
			t.Fatalf("Open(%d, %d): section (%d, %d), want (%d, %d)", c.off, c.n, off, n, c.off, c.want)
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		direct, err := io.ReadAll(io.LimitReader(f, n))
		if err != nil {
			t.Fatal(err)
		}
		viaReader, err := io.ReadAll(rc) // unaffected by the file's moved offset
		if err != nil {
			t.Fatal(err)
		}
		want := data[c.off : c.off+c.want]
		if !bytes.Equal(direct, want) || !bytes.Equal(viaReader, want) {
			t.Fatalf("Open(%d, %d): section and reader disagree with the object", c.off, c.n)
		}
		rc.Close()
	}
}

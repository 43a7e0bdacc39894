package storagemount

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// BenchmarkReadAttached reads one 256 MiB object through a ro FUSE attachment and, for
// comparison, straight from the same StorageFabric server with the client (what the
// mount adds: the kernel round trips and the readahead ranges), each over raw read
// streams and over StorageFabric.Read (in-memory pipes: no tunnel, no TLS).
//
//	go test -run '^$' -bench ReadAttached -benchtime 3x ./nodeagent/storagemount
func BenchmarkReadAttached(b *testing.B) {
	const size = 256 << 20
	for _, run := range []struct{ how, via string }{{"fuse", viaRaw}, {"fuse", viaGRPC}, {"client", viaRaw}, {"client", viaGRPC}} {
		how := run.how
		b.Run(how+"-"+run.via, func(b *testing.B) {
			if !fuseUsable("/dev/fuse") && how == "fuse" {
				b.Skip("/dev/fuse is not usable here")
			}
			e := newBenchEnv(b, run.via)
			e.store.putSynthetic("big.bin", size)
			var read func() (int64, error)
			if how == "fuse" {
				dir := e.attach(payload(attRO, alloctask.StorageModeRO))
				read = func() (int64, error) {
					f, err := os.Open(filepath.Join(dir, "big.bin"))
					if err != nil {
						return 0, err
					}
					defer f.Close()
					return io.Copy(io.Discard, f)
				}
			} else {
				c := NewClient(e.conns)
				read = func() (int64, error) {
					r, err := c.Open(context.Background(), attRO, "big.bin", 0, 0, "")
					if err != nil {
						return 0, err
					}
					defer r.Close()
					return io.Copy(io.Discard, r)
				}
			}
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				if n, err := read(); err != nil || n != size {
					b.Fatalf("read %d: %v", n, err)
				}
			}
		})
	}
}

package fabricnet_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// FuzzReadFrame feeds arbitrary bytes to the frame parser, as a peer on the other end of
// a tunnel could (the auth stream is read before the node is authenticated). For every
// input ReadFrame must not panic, must refuse a length over MaxFrameSize without
// reading on, and on success must have read exactly the frame (its uvarint length and
// that many bytes) and nothing after it, the stream's payload; the message it decoded
// must write back as a frame that reads back equal. Seeds: testdata/fuzz/FuzzReadFrame.
func FuzzReadFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []proto.Message{&fabricv1.AuthRequest{}, &fabricv1.StreamPreamble{}, &fabricv1.StreamReply{}} {
			r := bytes.NewReader(data)
			err := fabricnet.ReadFrame(r, m)
			size, n := binary.Uvarint(data)
			if errors.Is(err, fabricnet.ErrFrameTooLarge) {
				if n <= 0 || size <= fabricnet.MaxFrameSize {
					t.Fatalf("ErrFrameTooLarge for a length prefix of %d (%d bytes)", size, n)
				}
				if read := len(data) - r.Len(); read > n {
					t.Fatalf("read %d bytes past a refused length prefix of %d bytes", read, n)
				}
				continue
			}
			if err != nil {
				continue
			}
			if n <= 0 || size > fabricnet.MaxFrameSize {
				t.Fatalf("accepted a frame with length prefix %d (%d bytes)", size, n)
			}
			if read, want := len(data)-r.Len(), n+int(size); read != want {
				t.Fatalf("read %d bytes, the frame is %d", read, want)
			}
			var buf bytes.Buffer
			if err := fabricnet.WriteFrame(&buf, m); err != nil {
				t.Fatalf("decoded message does not write back: %v", err)
			}
			back := m.ProtoReflect().New().Interface()
			if err := fabricnet.ReadFrame(&buf, back); err != nil || !proto.Equal(m, back) {
				t.Fatalf("round trip: %v (%v != %v)", err, m, back)
			}
			if _, err := buf.ReadByte(); err != io.EOF {
				t.Fatal("a written frame read back with bytes left over")
			}
		}
	})
}

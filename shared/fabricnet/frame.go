package fabricnet

import (
	"errors"
	"io"

	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"
)

// MaxFrameSize bounds one frame (auth, preamble, reply): they are small, and a peer
// must not make the other allocate more.
const MaxFrameSize = 64 << 10

// ErrFrameTooLarge is returned by ReadFrame for a frame over MaxFrameSize.
var ErrFrameTooLarge = errors.New("fabricnet: frame too large")

// WriteFrame writes m as one frame: its length as a uvarint, then its bytes, in a single
// Write (so a QUIC stream becomes visible to the peer in one packet).
func WriteFrame(w io.Writer, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > MaxFrameSize {
		return ErrFrameTooLarge
	}
	buf := protodelimAppend(make([]byte, 0, len(b)+3), b)
	_, err = w.Write(buf)
	return err
}

func protodelimAppend(dst, b []byte) []byte {
	n := uint64(len(b))
	for n >= 0x80 {
		dst = append(dst, byte(n)|0x80)
		n >>= 7
	}
	dst = append(dst, byte(n))
	return append(dst, b...)
}

// ReadFrame reads one frame into m. It reads exactly the frame's bytes and nothing
// after them, so the stream's payload that follows stays unread.
func ReadFrame(r io.Reader, m proto.Message) error {
	err := protodelim.UnmarshalOptions{MaxSize: MaxFrameSize}.UnmarshalFrom(byteReader{r}, m)
	var big *protodelim.SizeTooLargeError
	if errors.As(err, &big) {
		return ErrFrameTooLarge
	}
	return err
}

// byteReader reads one byte at a time from r, without buffering beyond the frame.
type byteReader struct{ io.Reader }

func (b byteReader) ReadByte() (byte, error) {
	var p [1]byte
	for {
		n, err := b.Reader.Read(p[:])
		if n == 1 {
			return p[0], nil
		}
		if err != nil {
			return 0, err
		}
	}
}

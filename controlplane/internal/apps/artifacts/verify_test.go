package artifacts

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// The verifier never returns the last byte of a file whose bytes do not match.
func TestVerifierWithholdsTheEnd(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000)
	sum := sha256.Sum256(data)
	good := hex.EncodeToString(sum[:])
	read := func(stored []byte, size int64, want string) ([]byte, error) {
		mism := 0
		v := &verifier{r: io.NopCloser(iotest.HalfReader(bytes.NewReader(stored))), h: sha256.New(), size: size, want: want, onMismatch: func() { mism++ }}
		out, err := io.ReadAll(v)
		if (err != nil) != (mism == 1) {
			t.Fatalf("error %v but %d mismatches", err, mism)
		}
		return out, err
	}
	if out, err := read(data, int64(len(data)), good); err != nil || !bytes.Equal(out, data) {
		t.Fatalf("good: %v", err)
	}
	flipped := append([]byte(nil), data...)
	flipped[len(flipped)-1] ^= 1
	for name, c := range map[string]struct {
		stored []byte
		size   int64
	}{
		"last byte changed": {flipped, int64(len(data))},
		"shorter":           {data[:len(data)-1], int64(len(data))},
		"longer":            {append(append([]byte(nil), data...), 'x'), int64(len(data))},
	} {
		out, err := read(c.stored, c.size, good)
		if !errors.Is(err, ErrDigestMismatch) || len(out) >= len(data) {
			t.Errorf("%s: %d bytes, %v", name, len(out), err)
		}
	}
	empty := sha256.Sum256(nil)
	if out, err := read(nil, 0, hex.EncodeToString(empty[:])); err != nil || len(out) != 0 {
		t.Fatalf("empty: %v", err)
	}
	if _, err := read([]byte("x"), 0, hex.EncodeToString(empty[:])); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("empty with stored bytes: %v", err)
	}
}

package blob

import (
	"bytes"
	"io"
	"testing"
)

// TestPatternChunking: Pattern's bytes depend on n and seed only, not on how they are read
// (a test compares what one reader put with what another one regenerates).
func TestPatternChunking(t *testing.T) {
	whole, err := io.ReadAll(Pattern(100_003, 9))
	if err != nil || len(whole) != 100_003 {
		t.Fatalf("ReadAll = %d, %v", len(whole), err)
	}
	var pieces bytes.Buffer
	r := Pattern(100_003, 9)
	buf := make([]byte, 97)
	for {
		n, err := r.Read(buf[:1+pieces.Len()%97])
		pieces.Write(buf[:n])
		if err == io.EOF {
			break
		}
	}
	if !bytes.Equal(whole, pieces.Bytes()) {
		t.Fatal("Pattern read in small pieces differs from Pattern read whole")
	}
	other, _ := io.ReadAll(Pattern(100_003, 10))
	if bytes.Equal(whole, other) {
		t.Fatal("two seeds gave the same bytes")
	}
	if z := bytes.Count(whole, []byte{0}); z > len(whole)/100 {
		t.Fatalf("%d zero bytes of %d: not random-looking", z, len(whole))
	}
}

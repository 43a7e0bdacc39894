package nodetoken_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

var nodeID = uuid.MustParse("0195f3c2-7a10-7c4e-9b1d-2f3a4b5c6d7e")

func mint(t *testing.T) string {
	t.Helper()
	tok, err := nodetoken.New(nodeID, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestNewParseRoundTrip(t *testing.T) {
	tok := mint(t)
	if len(tok) != nodetoken.Len || !strings.HasPrefix(tok, "gnt_0195f3c27a107c4e9b1d2f3a4b5c6d7e_") {
		t.Fatalf("unexpected shape %q (len %d)", tok, len(tok))
	}
	id, err := nodetoken.Parse(tok)
	if err != nil || id != nodeID {
		t.Fatalf("Parse = %v, %v", id, err)
	}
	if tok2 := mint(t); tok2 == tok {
		t.Fatal("two tokens are equal")
	}
}

func TestNewDeterministicFromReader(t *testing.T) {
	zero := bytes.NewReader(make([]byte, 32))
	tok, err := nodetoken.New(nodeID, zero)
	if err != nil {
		t.Fatal(err)
	}
	want := "gnt_0195f3c27a107c4e9b1d2f3a4b5c6d7e_" + strings.Repeat("A", 43)
	if tok != want {
		t.Fatalf("got %q, want %q", tok, want)
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := nodetoken.New(uuid.Nil, rand.Reader); err == nil {
		t.Fatal("nil node id accepted")
	}
	if _, err := nodetoken.New(nodeID, iotest.ErrReader(errors.New("boom"))); err == nil {
		t.Fatal("failing reader accepted")
	}
	if _, err := nodetoken.New(nodeID, bytes.NewReader(make([]byte, 31))); err == nil {
		t.Fatal("short reader accepted")
	}
}

func TestParseMalformed(t *testing.T) {
	good := mint(t)
	secret := good[len(good)-43:]
	idHex := good[4:36]
	cases := map[string]string{
		"empty":             "",
		"prefix only":       "gnt_",
		"wrong prefix":      "gnx_" + good[4:],
		"upper prefix":      "GNT_" + good[4:],
		"short":             good[:len(good)-1],
		"long":              good + "A",
		"no separator":      "gnt_" + idHex + "-" + secret,
		"uppercase id":      "gnt_" + strings.ToUpper(idHex) + "_" + secret,
		"non hex id":        "gnt_" + "z" + idHex[1:] + "_" + secret,
		"dashed id":         "gnt_" + nodeID.String()[:32] + "_" + secret,
		"nil id":            "gnt_" + strings.Repeat("0", 32) + "_" + secret,
		"std base64 char":   "gnt_" + idHex + "_" + "+" + secret[1:],
		"padding":           "gnt_" + idHex + "_" + secret[:42] + "=",
		"space":             "gnt_" + idHex + "_" + " " + secret[1:],
		"non canonical pad": "gnt_" + idHex + "_" + secret[:42] + "B", // last char carries 2 spare bits
		"unicode":           "gnt_" + idHex + "_" + "é" + secret[2:],
		"jwt":               "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
	}
	for name, tok := range cases {
		if name == "non canonical pad" && tok == good {
			continue
		}
		if _, err := nodetoken.Parse(tok); !errors.Is(err, nodetoken.ErrMalformed) {
			t.Errorf("%s: Parse(%q) = %v, want ErrMalformed", name, tok, err)
		}
		if nodetoken.Verify(tok, nodetoken.Hash(tok)) {
			t.Errorf("%s: Verify accepted a malformed token", name)
		}
	}
}

func TestVerify(t *testing.T) {
	tok := mint(t)
	h := nodetoken.Hash(tok)
	if len(h) != 32 {
		t.Fatalf("hash length %d", len(h))
	}
	if !nodetoken.Verify(tok, h) {
		t.Fatal("own hash refused")
	}
	other := mint(t)
	if nodetoken.Verify(other, h) {
		t.Fatal("another token accepted")
	}
	if nodetoken.Verify(tok, nil) || nodetoken.Verify(tok, h[:31]) || nodetoken.Verify("", h) {
		t.Fatal("truncated or empty input accepted")
	}
	flipped := []byte(tok)
	flipped[len(flipped)-5] ^= 1
	if nodetoken.Verify(string(flipped), h) {
		t.Fatal("flipped secret accepted")
	}
}

func FuzzParse(f *testing.F) {
	good, _ := nodetoken.New(nodeID, rand.Reader)
	f.Add(good)
	f.Add("")
	f.Add("gnt_")
	f.Add("gnt_" + strings.Repeat("f", 32) + "_" + strings.Repeat("_", 43))
	f.Fuzz(func(t *testing.T, s string) {
		id, err := nodetoken.Parse(s)
		if err != nil {
			if id != uuid.Nil {
				t.Fatalf("error with non-nil id")
			}
			if nodetoken.Verify(s, nodetoken.Hash(s)) {
				t.Fatalf("Verify accepted unparseable %q", s)
			}
			return
		}
		// Anything Parse accepts has the fixed length and re-encodes to itself.
		if len(s) != nodetoken.Len || id == uuid.Nil {
			t.Fatalf("accepted %q", s)
		}
		if !strings.HasPrefix(s, "gnt_"+strings.ReplaceAll(id.String(), "-", "")+"_") {
			t.Fatalf("id %s does not match %q", id, s)
		}
		if !nodetoken.Verify(s, nodetoken.Hash(s)) {
			t.Fatalf("Verify refused its own hash for %q", s)
		}
	})
}

func BenchmarkParseVerify(b *testing.B) {
	tok, _ := nodetoken.New(nodeID, rand.Reader)
	h := nodetoken.Hash(tok)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := nodetoken.Parse(tok); err != nil || !nodetoken.Verify(tok, h) {
			b.Fatal("refused")
		}
	}
}

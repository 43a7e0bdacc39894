package pagination

import (
	"testing"
	"unicode/utf8"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// position is a list position as the handlers use them: a sort value and a tiebreaker.
type position struct {
	At string `json:"t"`
	ID string `json:"id"`
	N  int64  `json:"n,omitempty"`
}

var fuzzKey = []byte("fuzz-cursor-key")

// refusedAsCursor fails t unless err is invalid_request about the cursor field.
func refusedAsCursor(t *testing.T, err error) {
	t.Helper()
	e, ok := apierr.As(err)
	if !ok || e.Code != apierr.InvalidRequest || e.Details["field"] != "cursor" {
		t.Fatalf("refusal %v, want invalid_request on field cursor", err)
	}
}

// FuzzCursorDecode decodes arbitrary cursor strings, as a client can send any. Properties:
// no panic; every refusal is invalid_request on the cursor field; an accepted cursor is
// one the server signed (the fuzzer cannot forge the MAC, so only the seeds and their
// harmless variants pass), and its position encodes again to a cursor that decodes to
// the same position.
func FuzzCursorDecode(f *testing.F) {
	c := Codec{Key: fuzzKey}
	for _, p := range []position{{"2026-01-02T03:04:05Z", "0190f6a0-0000-7000-8000-000000000001", 0}, {"", "", -7}, {"x.y", "é", 1 << 40}} {
		cur, err := c.Encode("created_at", p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(cur, "created_at")
		f.Add(cur, "name")
	}
	f.Add("", "created_at")
	f.Add(".", "created_at")
	f.Add("e30.AAAAAAAAAAAAAAAAAAAAAA", "created_at")
	f.Add("not a cursor", "s")
	f.Fuzz(func(t *testing.T, cursor, sort string) {
		var pos position
		err := c.Decode(cursor, sort, &pos)
		if err != nil {
			refusedAsCursor(t, err)
			return
		}
		again, err := c.Encode(sort, pos)
		if err != nil {
			t.Fatal(err)
		}
		var pos2 position
		if err := c.Decode(again, sort, &pos2); err != nil || pos2 != pos {
			t.Fatalf("re-encoded %+v decodes to %+v (%v)", pos, pos2, err)
		}
		// Under another key the same cursor is forged.
		if err := (Codec{Key: []byte("another key")}).Decode(cursor, sort, &pos2); err == nil {
			t.Fatalf("cursor %q accepted under another key", cursor)
		}
	})
}

// FuzzCursorTamper encodes a position, changes one byte of the cursor, and decodes it.
// Properties: the untouched cursor round-trips exactly and is refused for another sort
// with cursor_sort_mismatch; a changed cursor is refused as invalid_request on the cursor
// field, or (a base64 variant of the same bytes) decodes to exactly the same position.
func FuzzCursorTamper(f *testing.F) {
	f.Add("created_at", "2026-01-02T03:04:05Z", "0190f6a0-0000-7000-8000-000000000001", int64(0), uint(0), byte('A'))
	f.Add("name", "", "z", int64(-1), uint(17), byte('.'))
	f.Add("s", "t", "id", int64(1)<<62, uint(1000), byte(0))
	c := Codec{Key: fuzzKey}
	f.Fuzz(func(t *testing.T, sort, at, id string, n int64, i uint, b byte) {
		if !utf8.ValidString(sort) || !utf8.ValidString(at) || !utf8.ValidString(id) {
			// Sorts are names in the code and positions come from PostgreSQL text, which
			// is valid UTF-8; JSON would replace invalid bytes with U+FFFD.
			return
		}
		want := position{at, id, n}
		cur, err := c.Encode(sort, want)
		if err != nil {
			t.Fatal(err)
		}
		var got position
		if err := c.Decode(cur, sort, &got); err != nil || got != want {
			t.Fatalf("round trip %+v -> %+v (%v)", want, got, err)
		}
		if err := c.Decode(cur, sort+"x", &got); err == nil {
			t.Fatal("cursor accepted for another sort")
		} else if e, ok := apierr.As(err); !ok || e.Details["reason"] != "cursor_sort_mismatch" {
			t.Fatalf("another sort: %v, want cursor_sort_mismatch", err)
		}
		tampered := []byte(cur)
		tampered[i%uint(len(tampered))] = b
		if string(tampered) == cur {
			return
		}
		got = position{}
		if err := c.Decode(string(tampered), sort, &got); err != nil {
			refusedAsCursor(t, err)
		} else if got != want {
			t.Fatalf("tampered cursor %q accepted as %+v (issued for %+v)", tampered, got, want)
		}
	})
}

package pagination

import (
	"errors"
	"testing"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

func TestNextAndDecodeAfterRoundTrip(t *testing.T) {
	c := Codec{Key: []byte("k")}
	if next, err := c.Next(false, "s", "x"); err != nil || next != nil {
		t.Fatalf("last page: next = %v, %v; want nil", next, err)
	}
	next, err := c.Next(true, "s", "row-41")
	if err != nil || next == nil {
		t.Fatalf("next = %v, %v", next, err)
	}
	pos := "unchanged"
	for _, cur := range []*string{nil, new(string)} {
		if err := c.DecodeAfter(cur, "s", &pos); err != nil || pos != "unchanged" {
			t.Fatalf("first page: pos = %q, %v", pos, err)
		}
	}
	if err := c.DecodeAfter(next, "s", &pos); err != nil || pos != "row-41" {
		t.Fatalf("decoded %q, %v; want row-41", pos, err)
	}
	var e *apierr.Error
	if err := c.DecodeAfter(next, "other", &pos); !errors.As(err, &e) || e.Code != apierr.InvalidRequest {
		t.Fatalf("other sort: %v; want invalid_request", err)
	}
	forged := *next + "x"
	if err := c.DecodeAfter(&forged, "s", &pos); !errors.As(err, &e) || e.Code != apierr.InvalidRequest {
		t.Fatalf("forged: %v; want invalid_request", err)
	}
}

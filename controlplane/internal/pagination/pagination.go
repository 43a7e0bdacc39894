// Package pagination owns page sizes and opaque cursors (seed §4.1, §8). A cursor names
// the sort it was issued for, so using it with another sort is refused, and is signed so
// clients cannot forge positions.
package pagination

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Page size limits (seed §8).
const (
	DefaultSize = 50
	MaxSize     = 200
)

// Size is the page size to use for the requested one (already range-checked by the
// contract validator; clamped here as a second line).
func Size(requested *int) int {
	if requested == nil {
		return DefaultSize
	}
	n := *requested
	if n < 1 {
		return 1
	}
	if n > MaxSize {
		return MaxSize
	}
	return n
}

// Codec encodes and decodes cursors with a server-held key.
type Codec struct {
	Key []byte
}

type envelope struct {
	Sort string          `json:"s"`
	Pos  json.RawMessage `json:"p"`
}

// Encode returns the cursor for position pos (any JSON value) under sort.
func (c Codec) Encode(sort string, pos any) (string, error) {
	p, err := json.Marshal(pos)
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(envelope{Sort: sort, Pos: p})
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(body) + "." + base64.RawURLEncoding.EncodeToString(c.mac(body)), nil
}

// Decode reads cursor into pos; it fails with invalid_request when the cursor is
// malformed, forged, or was issued for another sort.
func (c Codec) Decode(cursor, sort string, pos any) error {
	bad := apierr.New(apierr.InvalidRequest, "cursor is not valid").With("field", "cursor")
	b64, sig, ok := strings.Cut(cursor, ".")
	if !ok {
		return bad
	}
	body, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil {
		return bad
	}
	mac, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(mac, c.mac(body)) {
		return bad
	}
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return bad
	}
	if env.Sort != sort {
		return apierr.New(apierr.InvalidRequest, "cursor was issued for sort %q, not %q", env.Sort, sort).
			With("field", "cursor").With("reason", "cursor_sort_mismatch")
	}
	if err := json.Unmarshal(env.Pos, pos); err != nil {
		return bad
	}
	return nil
}

// DecodeAfter reads an optional cursor parameter into pos; an absent or empty cursor
// (the first page) leaves pos as it is.
func (c Codec) DecodeAfter(cursor *string, sort string, pos any) error {
	if cursor == nil || *cursor == "" {
		return nil
	}
	return c.Decode(*cursor, sort, pos)
}

// Next is a page's next_cursor: nil on the last page, else the cursor for pos (the
// position of the page's last row) under sort.
func (c Codec) Next(more bool, sort string, pos any) (*string, error) {
	if !more {
		return nil, nil
	}
	s, err := c.Encode(sort, pos)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

func (c Codec) mac(body []byte) []byte {
	m := hmac.New(sha256.New, c.Key)
	m.Write(body)
	return m.Sum(nil)[:16]
}

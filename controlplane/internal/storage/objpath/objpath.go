// Package objpath turns the path a client names an object by into the one canonical form
// the store keeps, or refuses it (seed §7.3 rule 2). It owns the rule for every place a
// storage path arrives from outside: the object API's `path` and `prefix`, the fabric's
// storage requests, an attachment's mount_path, and bucket_id.
//
// A path is joined under the bucket's namespace root and cleaned. The result is relative
// (no leading slash), has no "." or ".." elements, no empty elements and no trailing slash,
// is valid UTF-8 and holds no NUL or control characters. A backslash is a separator, so
// `..\..\x` and `../..\x` are caught like `../../x` (clients on Windows, and code that joins
// with filepath on the node, both read it that way).
//
// What resolves outside the root is ErrTraversal (400 storage_path_traversal): an absolute
// path, a ".." that climbs above the root, NUL and control bytes, invalid UTF-8 (overlong
// encodings of "." and "/" are invalid UTF-8), and elements made of dot look-alikes such as
// FULLWIDTH FULL STOP, which some normalising layers turn into "..". The HTTP layer
// decodes the query value once; a value that still carries %XX escapes is decoded again,
// repeatedly, and refused when a decoded form would escape, so a double-encoded `%252e%252e`
// cannot reach a layer that decodes once more. The stored path keeps the once-decoded
// spelling (`100%25.txt` arrives as `100%.txt` and stays that).
//
// Over MaxLen bytes is ErrTooLong and empty (or nothing left after cleaning, like "a/..")
// is ErrEmpty: both are 422 validation_error, field path, not traversal.
//
// A ".." that stays inside the root ("a/../b") is cleaned, not refused: the root is never
// left, and clients that build paths by concatenation produce such forms honestly.
package objpath

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLen is the longest object path in bytes (seed §4.1: path 1..1024).
const MaxLen = 1024

var (
	// ErrTraversal: the path would resolve outside the bucket root or carries bytes that
	// could make it do so somewhere downstream. Maps to 400 storage_path_traversal.
	ErrTraversal = errors.New("storage path escapes the bucket root")
	// ErrTooLong: more than MaxLen bytes. Maps to 422 validation_error (field path).
	ErrTooLong = errors.New("storage path is longer than 1024 bytes")
	// ErrEmpty: empty, or nothing is left once cleaned. Maps to 422 validation_error.
	ErrEmpty = errors.New("storage path is empty")
)

// maxDecodeRounds bounds the repeated percent-decoding: each round shrinks the string, so
// this only caps work on pathological input; four rounds already cover triple encoding.
const maxDecodeRounds = 4

// Clean returns the canonical relative form of the object path raw (already decoded once
// by the HTTP layer), or ErrTraversal, ErrTooLong or ErrEmpty (wrapped with a reason).
func Clean(raw string) (string, error) {
	if raw == "" {
		return "", ErrEmpty
	}
	if len(raw) > MaxLen {
		return "", ErrTooLong
	}
	if err := check(raw, false); err != nil {
		return "", err
	}
	if err := checkDecoded(raw); err != nil {
		return "", err
	}
	out := canonical(raw)
	if out == "" {
		return "", fmt.Errorf("%w: %q resolves to the bucket root itself", ErrEmpty, raw)
	}
	// Cleaning can expose a form the raw checks did not see: ".\\%2f" cleans to "%2f",
	// which decodes to an absolute path. The canonical form must pass on its own, so
	// that Clean(Clean(p)) == Clean(p) (FuzzClean found this one).
	if err := checkDecoded(out); err != nil {
		return "", err
	}
	return out, nil
}

// CleanPrefix is Clean for a listing prefix: empty is allowed (the whole bucket) and a
// trailing separator is kept ("a/b/" lists inside folder a/b, "a/b" also matches "a/bc").
// Its elements follow the path rules, so "." and ".." are path elements here, not the
// start of a name: "a/." is "a", and a prefix that climbs above the root is ErrTraversal.
func CleanPrefix(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	if len(raw) > MaxLen {
		return "", ErrTooLong
	}
	if err := check(raw, false); err != nil {
		return "", err
	}
	if err := checkDecoded(raw); err != nil {
		return "", err
	}
	out := canonical(raw)
	if err := checkDecoded(out); err != nil { // as in Clean
		return "", err
	}
	if out != "" && isSep(raw[len(raw)-1]) {
		out += "/"
	}
	return out, nil
}

// ValidBucketID reports whether s is a bucket_id: the seed's pattern
// ^[A-Za-z0-9][A-Za-z0-9:_./-]{0,127}$, and, because a bucket_id is also the default mount
// directory inside an allocation (~/buckets/<bucket_id>), a canonical relative path: no "."
// or ".." elements, no empty elements ("a//b") and no trailing slash. Bytes never live under
// a bucket_id (blob keys use the bucket's uuid), but a ".." there would climb out of
// ~/buckets on the node, and "a/./b" or "a//b" would alias the directory of bucket "a/b".
func ValidBucketID(s string) bool {
	if len(s) < 1 || len(s) > 128 || !isAlnum(s[0]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != ':' && c != '_' && c != '.' && c != '/' && c != '-' {
			return false
		}
	}
	for _, e := range strings.Split(s, "/") {
		if e == "" || e == "." || e == ".." {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isSep(c byte) bool { return c == '/' || c == '\\' }

// check refuses a form of the path that could resolve outside the root. decoded marks a
// form produced by our extra percent-decoding: there any ".." element is refused, even one
// that stays inside, because only an attacker double-encodes a dot segment.
func check(s string, decoded bool) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: invalid UTF-8", ErrTraversal)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			return fmt.Errorf("%w: NUL or control character %U", ErrTraversal, r)
		}
	}
	if isSep(s[0]) {
		return fmt.Errorf("%w: absolute path", ErrTraversal)
	}
	// "C:\x" and "C:/x" are absolute to a Windows client that writes the file back.
	if len(s) >= 3 && (s[0]|0x20) >= 'a' && (s[0]|0x20) <= 'z' && s[1] == ':' && isSep(s[2]) {
		return fmt.Errorf("%w: drive-absolute path", ErrTraversal)
	}
	depth := 0
	for _, e := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '\\' }) {
		switch {
		case e == ".":
		case e == "..":
			if decoded {
				return fmt.Errorf("%w: percent-encoded dot segment", ErrTraversal)
			}
			depth--
			if depth < 0 {
				return fmt.Errorf("%w: \"..\" climbs above the bucket root", ErrTraversal)
			}
		case dotLookalike(e):
			return fmt.Errorf("%w: element %q is made of dot look-alikes", ErrTraversal, e)
		default:
			depth++
		}
	}
	return nil
}

// checkDecoded decodes %XX escapes again, round after round, and refuses the path when a
// decoded form fails check: double (and deeper) encoding of "..", "/", NUL and the like.
func checkDecoded(s string) error {
	for range maxDecodeRounds {
		d, changed := percentDecode(s)
		if !changed {
			return nil
		}
		if d == "" {
			return nil
		}
		if err := check(d, true); err != nil {
			return fmt.Errorf("%w (after percent-decoding)", err)
		}
		s = d
	}
	return nil
}

// percentDecode decodes every well-formed %XX and keeps any other '%' literally, so a stray
// "%" (a name like "100%/x") cannot hide an escape later in the string the way
// url.PathUnescape, which gives up at the first bad escape, would let it.
func percentDecode(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, false
	}
	var b strings.Builder
	b.Grow(len(s))
	changed := false
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			changed = true
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), changed
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// dotLookalike reports whether e consists only of characters that Unicode normalisation
// (NFKC) or lenient decoders turn into '.', with at least one that is not ASCII: ASCII-only
// names such as "..." are ordinary names and stay allowed.
func dotLookalike(e string) bool {
	nonASCII := false
	for _, r := range e {
		switch r {
		case '.':
		case '\uff0e', // FULLWIDTH FULL STOP
			'\ufe52', // SMALL FULL STOP
			'\u2024', // ONE DOT LEADER
			'\u2025', // TWO DOT LEADER
			'\u2026', // HORIZONTAL ELLIPSIS
			'\u3002', // IDEOGRAPHIC FULL STOP
			'\uff61': // HALFWIDTH IDEOGRAPHIC FULL STOP
			nonASCII = true
		default:
			return false
		}
	}
	return nonASCII
}

// canonical joins the elements of an already checked path, applying "." and "..".
func canonical(s string) string {
	var elems []string
	for _, e := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '\\' }) {
		switch e {
		case ".":
		case "..":
			if len(elems) > 0 {
				elems = elems[:len(elems)-1]
			}
		default:
			elems = append(elems, e)
		}
	}
	return strings.Join(elems, "/")
}

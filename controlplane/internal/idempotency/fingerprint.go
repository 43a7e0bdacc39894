package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
)

// A request's fingerprint is what a repeated key is compared by. Two JSON bodies that
// say the same thing (other whitespace, other key order, other string escapes) are the
// same request, as a retrying client that re-serializes its body expects: the JSON body
// is compared in a canonical form. The canonical form keeps every number exactly as
// written (1, 1.0 and 1e0 stay different: the handler may tell them apart), so it never
// calls two requests equal that a handler could treat differently. A body that is not
// JSON (or not declared as JSON) is compared byte for byte.
//
// Fingerprints stored before canonical comparison existed are SHA-256 of method, route
// and raw bytes (legacyFingerprint); a key stored then is still matched by it until it
// expires (at most the retention, MinRetention or more), so no key in flight during an
// upgrade is refused. The canonical fingerprint is domain-separated from the legacy one
// by the "json-c14n" marker, so the two can never collide by construction.

// fingerprints returns the fingerprint to store for the request and the ones a stored
// fingerprint may equal to count as the same request.
func fingerprints(r *http.Request, sc Scope, body []byte) (store []byte, accept [][]byte) {
	legacy := legacyFingerprint(sc, body)
	canon, ok := canonicalJSON(r.Header.Get("Content-Type"), body)
	if !ok {
		return legacy, [][]byte{legacy}
	}
	h := sha256.New()
	h.Write([]byte(sc.Method + "\x00" + sc.Route + "\x00json-c14n\x00"))
	h.Write(canon)
	fp := h.Sum(nil)
	return fp, [][]byte{fp, legacy}
}

// legacyFingerprint is the raw-bytes fingerprint (and the fingerprint of every non-JSON
// body).
func legacyFingerprint(sc Scope, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte(sc.Method + "\x00" + sc.Route + "\x00"))
	h.Write(body)
	return h.Sum(nil)
}

// isJSONType reports whether a Content-Type declares JSON (application/json or a +json
// suffix).
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// canonicalJSON is body in canonical form: object keys sorted (bytewise, by their
// decoded value), no insignificant whitespace, strings re-encoded one way, numbers as
// written. ok is false when the body is not declared JSON or is not exactly one JSON
// value.
func canonicalJSON(contentType string, body []byte) ([]byte, bool) {
	if !isJSONType(contentType) || len(bytes.TrimSpace(body)) == 0 {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false // trailing data: not one JSON value
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // one fixed way: "<" and "\u003c" agree
	if err := writeCanonical(&buf, enc, v); err != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

// writeCanonical writes v to buf; enc is an encoder on buf, for strings.
func writeCanonical(buf *bytes.Buffer, enc *json.Encoder, v any) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeString(buf, enc, k); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := writeCanonical(buf, enc, x[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, enc, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case string:
		return writeString(buf, enc, x)
	case json.Number:
		buf.WriteString(x.String()) // exactly as written
	case bool:
		if x {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case nil:
		buf.WriteString("null")
	default:
		return errors.New("idempotency: unexpected JSON value")
	}
	return nil
}

// writeString encodes s one fixed way, with enc (an encoder on buf without HTML
// escaping).
func writeString(buf *bytes.Buffer, enc *json.Encoder, s string) error {
	if err := enc.Encode(s); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // Encode appends a newline
	return nil
}

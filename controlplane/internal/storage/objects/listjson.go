package objects

import (
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gantry-gpu/gantry/proto/api"
)

// listAnswer is ListStorageObjects' 200 answer, written by appendList instead of the
// generated response's reflective encoding/json: a page of 200 objects spent about a
// third of the handler's CPU there (reflection, time.Time.MarshalJSON and the
// re-compaction of its output, the buffer's growth). The bytes are exactly the
// generated response's (TestListAnswerMatchesGenerated compares them over awkward
// strings and times), so the contract sees no difference.
type listAnswer struct {
	body    api.StorageObjectListResponse
	headers api.ListStorageObjects200ResponseHeaders
}

var _ api.ListStorageObjectsResponseObject = listAnswer{}

// VisitListStorageObjectsResponse writes the answer as the generated response does.
func (a listAnswer) VisitListStorageObjectsResponse(w http.ResponseWriter) error {
	if !encodable(a.body) {
		// A time encoding/json refuses: the generated response says so, as it always did.
		return api.ListStorageObjects200JSONResponse{Body: a.body, Headers: a.headers}.VisitListStorageObjectsResponse(w)
	}
	buf := appendList(make([]byte, 0, 128+len(a.body.Objects)*256+len(a.body.CommonPrefixes)*48), a.body)
	w.Header().Set("Content-Type", "application/json")
	if a.headers.XRequestID != nil {
		w.Header().Set("X-Request-Id", *a.headers.XRequestID)
	}
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(buf)
	return err
}

// encodable reports whether every time of b is one time.Time.MarshalJSON accepts.
func encodable(b api.StorageObjectListResponse) bool {
	for _, o := range b.Objects {
		if y := o.UpdatedAt.Year(); y < 0 || y > 9999 {
			return false
		}
	}
	return true
}

// appendList appends b as json.NewEncoder(w).Encode(b) writes it: fields in declaration
// order, HTML-safe string escaping, RFC 3339 times with nanoseconds, a final newline.
func appendList(dst []byte, b api.StorageObjectListResponse) []byte {
	dst = append(dst, `{"common_prefixes":`...)
	if b.CommonPrefixes == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, p := range b.CommonPrefixes {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, p)
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"objects":`...)
	if b.Objects == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, o := range b.Objects {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"content_type":`...)
			dst = appendString(dst, o.ContentType)
			dst = append(dst, `,"etag":`...)
			dst = appendString(dst, o.Etag)
			dst = append(dst, `,"path":`...)
			dst = appendString(dst, o.Path)
			dst = append(dst, `,"size_bytes":`...)
			dst = strconv.AppendInt(dst, o.SizeBytes, 10)
			dst = append(dst, `,"updated_at":"`...)
			dst = o.UpdatedAt.AppendFormat(dst, time.RFC3339Nano)
			dst = append(dst, `"}`...)
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"pagination":{"next_cursor":`...)
	if b.Pagination.NextCursor == nil {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, *b.Pagination.NextCursor)
	}
	dst = append(dst, `,"page_size":`...)
	dst = strconv.AppendInt(dst, int64(b.Pagination.PageSize), 10)
	return append(dst, "}}\n"...)
}

const hexDigits = "0123456789abcdef"

// plain marks the ASCII bytes a JSON string carries as they are.
var plain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString appends s quoted as encoding/json quotes a string with HTML escaping on
// (the Encoder's default): `"` and `\` escaped, \b \f \n \r \t short, other control
// characters and < > & as \u00XX, invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if plain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

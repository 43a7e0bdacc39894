package objects

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// byteRange is one satisfiable range [Off, Off+N) of an object.
type byteRange struct {
	Off, N int64
}

// parseRange reads a Range header against an object of size bytes (RFC 9110 §14).
// Only a single bytes range is served: no header, another unit, a malformed value or a
// list of ranges give ok=false and the whole object (a server may ignore Range). A
// well-formed range that selects nothing (it starts at or past the end, or a suffix of
// zero bytes) is 416 with Content-Range "bytes */size", per §15.5.17.
func parseRange(header string, size int64) (r byteRange, ok bool, err error) {
	spec, found := strings.CutPrefix(strings.TrimSpace(header), "bytes=")
	if !found || strings.Contains(spec, ",") {
		return byteRange{}, false, nil
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return byteRange{}, false, nil
	}
	if first == "" { // suffix: the last n bytes
		n, perr := parseDigits(last)
		if perr != nil {
			return byteRange{}, false, nil
		}
		if n == 0 || size == 0 {
			return byteRange{}, false, unsatisfiable(size)
		}
		n = min(n, size)
		return byteRange{Off: size - n, N: n}, true, nil
	}
	off, perr := parseDigits(first)
	if perr != nil {
		return byteRange{}, false, nil
	}
	end := int64(-1)
	if last != "" {
		if end, perr = parseDigits(last); perr != nil || end < off {
			return byteRange{}, false, nil // invalid: last-pos before first-pos
		}
	}
	if off >= size {
		return byteRange{}, false, unsatisfiable(size)
	}
	if end < 0 || end >= size {
		end = size - 1
	}
	return byteRange{Off: off, N: end - off + 1}, true, nil
}

// parseDigits accepts only 1*DIGIT (no sign, no spaces), as the grammar does.
func parseDigits(s string) (int64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseInt(s, 10, 64)
}

// errRangeNotSatisfiable carries the object size for the Content-Range of the 416.
type errRangeNotSatisfiable struct{ size int64 }

func (e errRangeNotSatisfiable) Error() string { return "range not satisfiable" }

func unsatisfiable(size int64) error {
	return apierr.New(apierr.InvalidRequest, "the requested range is outside the object (%d bytes)", size).
		With("field", "Range").With("reason", "range_not_satisfiable").With("size_bytes", size).
		WithStatus(http.StatusRequestedRangeNotSatisfiable).Wrap(errRangeNotSatisfiable{size: size})
}

// contentRange is the Content-Range value of a 206.
func contentRange(r byteRange, size int64) string {
	return "bytes " + strconv.FormatInt(r.Off, 10) + "-" + strconv.FormatInt(r.Off+r.N-1, 10) + "/" + strconv.FormatInt(size, 10)
}

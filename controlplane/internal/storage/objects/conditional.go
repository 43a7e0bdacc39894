package objects

import (
	"net/http"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Preconditions are the conditional request headers of RFC 9110 §13 that object
// operations honour. ETags are strong (quoted sha256 hex of the content), so If-Match
// compares strongly and If-None-Match weakly, as §13.1 asks.
type Preconditions struct {
	IfMatch         string
	IfNoneMatch     string
	IfModifiedSince string
	IfRange         string
}

// preconditionsOf reads the headers of r.
func preconditionsOf(h http.Header) Preconditions {
	return Preconditions{
		IfMatch: h.Get("If-Match"), IfNoneMatch: h.Get("If-None-Match"),
		IfModifiedSince: h.Get("If-Modified-Since"), IfRange: h.Get("If-Range"),
	}
}

// CreateOnly reports `If-None-Match: *`: the write must not replace an object.
func (p Preconditions) CreateOnly() bool { return strings.TrimSpace(p.IfNoneMatch) == "*" }

// outcome of evaluating preconditions.
type outcome int

const (
	proceed outcome = iota
	notModified
	preconditionFailed
	alreadyExists
)

// evaluate applies §13.2.2's order to the current object (exists=false: none). read is
// true for GET and HEAD, which answer a matching If-None-Match with 304; a write answers
// it with 412, except `If-None-Match: *` on a write, which the contract names
// storage_already_exists (409).
func (p Preconditions) evaluate(exists bool, etag string, modified time.Time, read bool) outcome {
	if p.IfMatch != "" {
		if !exists || !matches(p.IfMatch, etag, true) {
			return preconditionFailed
		}
	}
	if p.IfNoneMatch != "" {
		if exists && matches(p.IfNoneMatch, etag, false) {
			switch {
			case read:
				return notModified
			case p.CreateOnly():
				return alreadyExists
			default:
				return preconditionFailed
			}
		}
		return proceed
	}
	// If-Modified-Since only counts for reads and only without If-None-Match (§13.1.3).
	if read && exists && p.IfModifiedSince != "" {
		if t, err := http.ParseTime(p.IfModifiedSince); err == nil && !modified.Truncate(time.Second).After(t) {
			return notModified
		}
	}
	return proceed
}

// rangeApplies is If-Range (§13.1.5): with an entity tag, the Range is served only while
// the object still has that strong tag; with a date, only while it is unmodified since.
func (p Preconditions) rangeApplies(etag string, modified time.Time) bool {
	v := strings.TrimSpace(p.IfRange)
	if v == "" {
		return true
	}
	if strings.HasPrefix(v, `"`) || strings.HasPrefix(v, "W/") {
		return !strings.HasPrefix(v, "W/") && v == etag
	}
	t, err := http.ParseTime(v)
	return err == nil && modified.Truncate(time.Second).Equal(t)
}

// matches reports whether list (an entity-tag list or "*") names etag. strong refuses
// weak tags (W/"..."), as If-Match requires.
func matches(list, etag string, strong bool) bool {
	list = strings.TrimSpace(list)
	if list == "*" {
		return true
	}
	for _, tag := range splitTags(list) {
		weak := strings.HasPrefix(tag, "W/")
		if weak {
			if strong {
				continue
			}
			tag = tag[2:]
		}
		if tag == etag {
			return true
		}
	}
	return false
}

// splitTags splits an entity-tag list on the commas between quoted tags (a tag may not
// contain a quote, but could contain a comma).
func splitTags(list string) []string {
	var out []string
	for rest := strings.TrimSpace(list); rest != ""; rest = strings.TrimLeft(rest, ", \t") {
		start := 0
		if strings.HasPrefix(rest, "W/") {
			start = 2
		}
		if len(rest) <= start || rest[start] != '"' {
			return out // malformed: what has been read so far
		}
		end := strings.IndexByte(rest[start+1:], '"')
		if end < 0 {
			return out
		}
		out = append(out, rest[:start+1+end+1])
		rest = rest[start+1+end+1:]
	}
	return out
}

// ETag is the entity tag of content with the given sha256 hex digest.
func ETag(sha256Hex string) string { return `"` + sha256Hex + `"` }

func errPreconditionFailed() error {
	return apierr.New(apierr.InvalidRequest, "a precondition of the request does not hold for the object").
		With("reason", "precondition_failed").WithStatus(http.StatusPreconditionFailed)
}

func errAlreadyExists(path string) error {
	return apierr.New(apierr.StorageAlreadyExists, "an object already exists at this path").With("path", path)
}

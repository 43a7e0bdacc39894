package objects

import (
	"context"
	"strings"
)

// Entry is one line of a listing: an object, or (Prefix true) a common prefix standing
// for every object under it, folder-style.
type Entry struct {
	Prefix bool
	Path   string // the object's path, or the common prefix (ending in the delimiter)
	// Object is what a listing answers of the object: path, size, ETag, content type and
	// update time (a flat listing reads no more; never the blob key).
	Object ObjectInfo
}

// ListPage is one page of a listing in lexicographic (byte, COLLATE "C") order.
type ListPage struct {
	Entries []Entry
	// Next is the position after the page's last entry; empty when nothing follows.
	Next *Position
}

// Position is where a listing resumes: after Path, and, when Path is a common prefix,
// after everything under it.
type Position struct {
	After      string `json:"a"`
	PastPrefix bool   `json:"p,omitempty"`
}

// rowsFrom reads up to limit objects in path order from start (inclusive when
// inclusive) that begin with prefix.
type rowsFrom func(ctx context.Context, start string, inclusive bool, prefix string, limit int) ([]ObjectInfo, error)

// listBatch is how many rows one query reads; a page of common prefixes whose folders
// hold more than this reads once more per folder it crosses.
const listBatch = 256

// list builds a page of at most limit entries. With a delimiter, every object whose path
// continues past the prefix and contains the delimiter collapses into one common prefix
// (prefix + the path up to and including the first delimiter after it), and the scan
// jumps past that prefix's objects instead of reading them: the next key after every
// path starting with cp is cp with its last byte incremented (byte order, which is
// COLLATE "C" on UTF-8).
func list(ctx context.Context, fetch rowsFrom, prefix, delimiter string, from *Position, limit int) (ListPage, error) {
	start, inclusive := startOf(prefix, from)
	page := ListPage{Entries: make([]Entry, 0, min(limit, listBatch))}
	for len(page.Entries) < limit {
		want := min(listBatch, limit-len(page.Entries)+1)
		rows, err := fetch(ctx, start, inclusive, prefix, want)
		if err != nil {
			return ListPage{}, err
		}
		used, jumped := 0, false
		for _, o := range rows {
			if len(page.Entries) == limit {
				break
			}
			used++
			if cp, ok := commonPrefix(o.Path, prefix, delimiter); ok {
				page.Entries = append(page.Entries, Entry{Prefix: true, Path: cp})
				start, inclusive, jumped = successor(cp), true, true
				break
			}
			page.Entries = append(page.Entries, Entry{Path: o.Path, Object: o})
			start, inclusive = o.Path, false
		}
		if len(page.Entries) < limit {
			if !jumped && len(rows) < want {
				return page, nil // nothing more under the prefix
			}
			continue
		}
		// The page is full: something follows when this batch holds an unread row (not
		// after a jump, which skipped the rest), else when one more row exists.
		more := !jumped && used < len(rows)
		if !more {
			next, err := fetch(ctx, start, inclusive, prefix, 1)
			if err != nil {
				return ListPage{}, err
			}
			more = len(next) > 0
		}
		if more {
			last := page.Entries[len(page.Entries)-1]
			page.Next = &Position{After: last.Path, PastPrefix: last.Prefix}
		}
	}
	return page, nil
}

// startOf is where a listing under prefix resumes from position from (nil: the start):
// the first path to read, and whether that path itself is included.
func startOf(prefix string, from *Position) (string, bool) {
	start, inclusive := prefix, true
	if from != nil {
		start, inclusive = from.After, false
		if from.PastPrefix {
			start, inclusive = successor(from.After), true
		}
		if start < prefix {
			start, inclusive = prefix, true
		}
	}
	return start, inclusive
}

// commonPrefix is the folder of path under prefix for delimiter, if any.
func commonPrefix(path, prefix, delimiter string) (string, bool) {
	if delimiter == "" {
		return "", false
	}
	rest := path[len(prefix):]
	i := strings.Index(rest, delimiter)
	if i < 0 {
		return "", false
	}
	return path[:len(prefix)+i+len(delimiter)], true
}

// successor is the least string greater than every string that starts with s: s with
// its last byte incremented (a last byte of 0xff, which UTF-8 never contains, carries).
func successor(s string) string {
	b := []byte(s)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return s + "\xff" // unreachable for valid UTF-8
}

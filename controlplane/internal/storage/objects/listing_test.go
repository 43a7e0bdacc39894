package objects

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
)

// sortedRows answers fetch from an in-memory sorted set of paths, counting queries.
type sortedRows struct {
	paths   []string
	queries int
}

func (s *sortedRows) fetch(_ context.Context, start string, inclusive bool, prefix string, limit int) ([]ObjectInfo, error) {
	s.queries++
	i := sort.SearchStrings(s.paths, start)
	if !inclusive && i < len(s.paths) && s.paths[i] == start {
		i++
	}
	var out []ObjectInfo
	for ; i < len(s.paths) && len(out) < limit; i++ {
		if !strings.HasPrefix(s.paths[i], prefix) {
			if s.paths[i] > prefix {
				break
			}
			continue
		}
		out = append(out, ObjectInfo{Path: s.paths[i]})
	}
	return out, nil
}

// walk lists every page and returns the entries (prefixes marked with a trailing "*").
func walk(t *testing.T, rows *sortedRows, prefix, delim string, limit int) []string {
	t.Helper()
	var got []string
	var from *Position
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("listing does not end")
		}
		pg, err := list(context.Background(), rows.fetch, prefix, delim, from, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(pg.Entries) > limit || (pg.Next != nil && len(pg.Entries) != limit) {
			t.Fatalf("page of %d entries (limit %d, next %v)", len(pg.Entries), limit, pg.Next)
		}
		for _, e := range pg.Entries {
			if e.Prefix {
				got = append(got, e.Path+"*")
			} else {
				got = append(got, e.Path)
			}
		}
		if pg.Next == nil {
			return got
		}
		from = pg.Next
	}
}

// expected is the listing computed the obvious way: every path under prefix, folded.
func expected(paths []string, prefix, delim string) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range paths {
		if !strings.HasPrefix(p, prefix) {
			continue
		}
		if cp, ok := commonPrefix(p, prefix, delim); ok {
			if !seen[cp] {
				seen[cp] = true
				out = append(out, cp+"*")
			}
			continue
		}
		out = append(out, p)
	}
	return out
}

func TestListFoldsCommonPrefixes(t *testing.T) {
	var paths []string
	for i := range 40 {
		paths = append(paths, fmt.Sprintf("data/%02d.bin", i))
	}
	for i := range 600 {
		paths = append(paths, fmt.Sprintf("logs/run%d/%04d.txt", i%3, i))
	}
	paths = append(paths, "a", "data/", "data/sub/x", "data/sub/y", "data0", "data/sub", "z/", "é/1", "logs", "logs0/x")
	slices.Sort(paths)
	paths = slices.Compact(paths)
	for _, prefix := range []string{"", "data/", "logs/", "logs/run1/", "d", "nothing/", "é"} {
		for _, delim := range []string{"", "/"} {
			for _, limit := range []int{1, 2, 3, 7, 50, 200} {
				rows := &sortedRows{paths: paths}
				got := walk(t, rows, prefix, delim, limit)
				if want := expected(paths, prefix, delim); !slices.Equal(got, want) {
					t.Fatalf("prefix %q delim %q limit %d:\n got %v\nwant %v", prefix, delim, limit, got, want)
				}
			}
		}
	}
}

func TestListJumpsOverFolders(t *testing.T) {
	// 3 folders of 10,000 objects: a folded listing reads a few rows, not 30,000.
	var paths []string
	for _, f := range []string{"a", "b", "c"} {
		for i := range 10000 {
			paths = append(paths, fmt.Sprintf("%s/%05d", f, i))
		}
	}
	rows := &sortedRows{paths: paths}
	got := walk(t, rows, "", "/", 50)
	if !slices.Equal(got, []string{"a/*", "b/*", "c/*"}) {
		t.Fatalf("got %v", got)
	}
	if rows.queries > 5 {
		t.Fatalf("%d queries for 3 folders", rows.queries)
	}
}

func TestSuccessor(t *testing.T) {
	for in, want := range map[string]string{"a/": "a0", "ab": "ac", "a\xff": "b", "": "\xff"} {
		if got := successor(in); got != want {
			t.Errorf("successor(%q) = %q, want %q", in, got, want)
		}
	}
}

package objects_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects"
)

// TestFoldedListingMatchesOracle lists a bucket of many folders, nested folders, and
// paths that sort between a folder and its jump target ("a/" < "a.x" < "a0" in byte
// order) through the one-statement folded listing, under many prefixes and page sizes,
// and compares every walk with the listing computed from all paths in Go.
func TestFoldedListingMatchesOracle(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	var paths []string
	for f := range 60 {
		for i := range 1 + f%7 {
			paths = append(paths, fmt.Sprintf("f%02d/%d", f, i))
			if f%5 == 0 {
				paths = append(paths, fmt.Sprintf("f%02d/sub%d/x", f, i%2), fmt.Sprintf("f%02d/sub%d/deep/y", f, i))
			}
		}
	}
	paths = append(paths, "a", "a/", "a/b", "a.x", "a0", "a/b/c", "a-b/c", "b//c", "f00", "f00.txt", "f0", "é/1", "é", "éa/2",
		"z/ü/1", "z/ü0", "z/üa/3", "~", "~/x")
	slices.Sort(paths)
	paths = slices.Compact(paths)
	var bucket uuid.UUID
	if err := w.env.Pool.QueryRow(ctx, `SELECT id FROM storage_buckets WHERE bucket_id = $1`, w.bucket).Scan(&bucket); err != nil {
		t.Fatal(err)
	}
	if _, err := w.env.Pool.Exec(ctx, `INSERT INTO storage_objects (bucket, path, project_id, blob_key, size_bytes, etag, content_type, created_at, updated_at)
		SELECT $1, p, $2, 'k/' || p, 1, '"x"', 'application/octet-stream', now(), now() FROM unnest($3::text[]) AS p`,
		bucket, uuid.MustParse(w.project), paths); err != nil {
		t.Fatal(err)
	}
	store := w.env.App.Objects
	b := objects.Bucket{ID: bucket}
	for _, prefix := range []string{"", "a", "a/", "a/b/", "f0", "f00/", "f05/", "f05/sub1/", "f10/sub0/deep/", "é", "z/", "z/ü", "nothing/", "~"} {
		for _, limit := range []int{1, 2, 3, 7, 50, 200} {
			var got []string
			var from *objects.Position
			for pages := 0; ; pages++ {
				if pages > len(paths)+1 {
					t.Fatalf("prefix %q limit %d: the listing does not end", prefix, limit)
				}
				pg, err := store.List(ctx, b, prefix, "/", from, limit)
				if err != nil {
					t.Fatal(err)
				}
				if len(pg.Entries) > limit || (pg.Next != nil && len(pg.Entries) != limit) {
					t.Fatalf("prefix %q: page of %d entries (limit %d, next %v)", prefix, len(pg.Entries), limit, pg.Next)
				}
				for _, e := range pg.Entries {
					if e.Prefix {
						got = append(got, e.Path+"*")
					} else {
						if e.Object.Path != e.Path || e.Object.SizeBytes != 1 {
							t.Fatalf("entry %q carries %+v", e.Path, e.Object)
						}
						got = append(got, e.Path)
					}
				}
				if pg.Next == nil {
					break
				}
				from = pg.Next
			}
			if want := folded(paths, prefix); !slices.Equal(got, want) {
				t.Fatalf("prefix %q limit %d:\n got %q\nwant %q", prefix, limit, got, want)
			}
		}
	}
}

// folded is the listing of paths under prefix the obvious way: every path, its first
// "/" after the prefix folding it into a common prefix (marked with a trailing "*").
func folded(paths []string, prefix string) []string {
	var out []string
	for _, p := range paths {
		rest, ok := strings.CutPrefix(p, prefix)
		if !ok {
			continue
		}
		if i := strings.Index(rest, "/"); i >= 0 {
			if cp := prefix + rest[:i+1] + "*"; len(out) == 0 || out[len(out)-1] != cp {
				out = append(out, cp)
			}
			continue
		}
		out = append(out, p)
	}
	return out
}

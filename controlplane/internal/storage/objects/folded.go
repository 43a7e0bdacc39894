package objects

import (
	"context"
	"fmt"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
)

// foldedQuery is a folder-style page in one statement: a loose index scan over the
// primary key (bucket, path COLLATE "C"). Each step reads the single next row of the
// bucket from where the previous one left off: past an object, the next path after
// it; past a common prefix, the least path after everything under it (the prefix with
// its delimiter's last byte incremented, so "a/" jumps to "a0"). So a page costs one
// index probe per entry however many objects a folded folder holds. Every probe is
// a bare "path >= x" on the index with LIMIT 1; the first row past the listing's own
// prefix ends the walk (it is read, not kept), so the end of the prefix never turns a
// probe into a scan of the rest of the bucket.
//
// $1 bucket, $2 start, $3 the path to skip (an exclusive start; ” when none, no
// object has an empty path), $4 prefix, $5 delimiter, $6 successor of the delimiter,
// $7 entries wanted. Lengths and positions are in characters throughout (substr,
// strpos, left), which agree with one another on UTF-8.
const foldedQuery = `
WITH RECURSIVE walk AS (
  SELECT f.*, 1 AS n FROM (
    SELECT o.path, o.blob_key, o.size_bytes, o.etag, o.content_type, o.created_by, o.created_at, o.updated_at,
      CASE WHEN strpos(substr(o.path, char_length($4::text) + 1), $5::text) > 0
           THEN left(o.path, char_length($4::text) + strpos(substr(o.path, char_length($4::text) + 1), $5::text) + char_length($5::text) - 1)
      END AS folder
    FROM storage_objects o
    WHERE o.bucket = $1 AND o.path >= $2::text COLLATE "C" AND o.path <> $3::text COLLATE "C"
    ORDER BY o.path LIMIT 1
  ) f
  UNION ALL
  SELECT nx.*, w.n + 1 FROM walk w
  CROSS JOIN LATERAL (
    SELECT o.path, o.blob_key, o.size_bytes, o.etag, o.content_type, o.created_by, o.created_at, o.updated_at,
      CASE WHEN strpos(substr(o.path, char_length($4::text) + 1), $5::text) > 0
           THEN left(o.path, char_length($4::text) + strpos(substr(o.path, char_length($4::text) + 1), $5::text) + char_length($5::text) - 1)
      END AS folder
    FROM storage_objects o
    WHERE o.bucket = $1
      AND o.path >= (CASE WHEN w.folder IS NULL THEN w.path
                          ELSE left(w.folder, -char_length($5::text)) || $6::text END) COLLATE "C"
      AND o.path <> w.path
    ORDER BY o.path LIMIT 1
  ) nx
  WHERE w.n < $7 AND starts_with(w.path, $4::text)
)
SELECT path, blob_key, size_bytes, etag, content_type, created_by, created_at, updated_at, folder
FROM walk WHERE starts_with(path, $4::text) ORDER BY n`

// listFolded is list for a non-empty delimiter in at most two statements. The first
// reads the page as a plain range of rows, which is all a folder of objects needs; at
// the first row that folds into a common prefix the rest of the page comes from
// foldedQuery, starting at that row, whatever number of folders follows.
func (s *Store) listFolded(ctx context.Context, b Bucket, prefix, delimiter string, from *Position, limit int, fetch rowsFrom) (ListPage, error) {
	start, inclusive := startOf(prefix, from)
	rows, err := fetch(ctx, start, inclusive, prefix, limit+1)
	if err != nil {
		return ListPage{}, err
	}
	var page ListPage
	for i, o := range rows {
		if _, ok := commonPrefix(o.Path, prefix, delimiter); ok {
			return s.foldRest(ctx, b, prefix, delimiter, o.Path, page, limit)
		}
		if len(page.Entries) == limit {
			break
		}
		page.Entries = append(page.Entries, Entry{Path: o.Path, Object: o})
		if i == len(rows)-1 {
			return page, nil // nothing more under the prefix
		}
	}
	if len(page.Entries) == limit && len(rows) > limit {
		page.Next = &Position{After: page.Entries[limit-1].Path}
	}
	return page, nil
}

// foldRest completes page from the path first (inclusive) with foldedQuery.
func (s *Store) foldRest(ctx context.Context, b Bucket, prefix, delimiter, first string, page ListPage, limit int) (ListPage, error) {
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, foldedQuery, b.ID, first, "", prefix, delimiter, successor(delimiter), limit-len(page.Entries)+1)
	if err != nil {
		return ListPage{}, fmt.Errorf("list objects: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var o ObjectInfo
		var folder *string
		if err := rows.Scan(&o.Path, &o.blobKey, &o.SizeBytes, &o.ETag, &o.ContentType, &o.CreatedBy, &o.CreatedAt, &o.UpdatedAt, &folder); err != nil {
			return ListPage{}, fmt.Errorf("list objects: %w", err)
		}
		if len(page.Entries) == limit {
			last := page.Entries[limit-1]
			page.Next = &Position{After: last.Path, PastPrefix: last.Prefix}
			break
		}
		if folder != nil {
			page.Entries = append(page.Entries, Entry{Prefix: true, Path: *folder})
		} else {
			page.Entries = append(page.Entries, Entry{Path: o.Path, Object: o})
		}
	}
	if err := rows.Err(); err != nil {
		return ListPage{}, fmt.Errorf("list objects: %w", err)
	}
	return page, nil
}

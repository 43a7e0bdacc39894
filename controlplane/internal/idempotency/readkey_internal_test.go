package idempotency

import (
	"os"
	"strings"
	"testing"
)

// lockAndRead sends GetIdempotencyKey's SQL in a batch with the lock, which sqlc's
// generated method cannot join: its copy must stay the query queries.sql declares.
func TestReadKeySQLIsTheGeneratedQuery(t *testing.T) {
	src, err := os.ReadFile("queries.sql")
	if err != nil {
		t.Fatal(err)
	}
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	_, decl, ok := strings.Cut(string(src), "-- name: GetIdempotencyKey :one")
	if !ok {
		t.Fatal("queries.sql declares no GetIdempotencyKey")
	}
	decl, _, _ = strings.Cut(decl, ";")
	if norm(decl) != norm(readKeySQL) {
		t.Fatalf("readKeySQL %q differs from queries.sql's GetIdempotencyKey %q", norm(readKeySQL), norm(decl))
	}
}

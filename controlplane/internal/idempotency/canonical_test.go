package idempotency_test

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
)

// TestSameJSONInOtherFormIsTheSameRequest: a retry that re-serializes its body (other
// whitespace, key order, string escapes) replays the first answer instead of being
// refused as idempotency_key_reused; a body that differs in meaning (or in how a number
// is written) is still refused, and nothing runs twice.
func TestSameJSONInOtherFormIsTheSameRequest(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Canonical")

	status, first := read(t, createProject(e, ten.AdminToken, "c14n", `{"name":"canon","slug":"canon-1"}`))
	if status != 201 {
		t.Fatalf("first: %d %s", status, first)
	}
	for _, same := range []string{
		"{ \"slug\" : \"canon-1\",\n\t\"name\":\"canon\" }",
		`{"name":"can\u006fn","slug":"canon-1"}`,
		`{"slug":"canon-1","name":"canon"}`,
	} {
		resp := createProject(e, ten.AdminToken, "c14n", same)
		replayed := resp.Header.Get("Idempotent-Replayed")
		status, body := read(t, resp)
		if status != 201 || replayed != "true" || body != first {
			t.Fatalf("%s: %d replayed=%q %s (first %s)", same, status, replayed, body, first)
		}
	}
	status, body := read(t, createProject(e, ten.AdminToken, "c14n", `{"slug":"canon-1","name":"Canon"}`))
	if status != 422 || !strings.Contains(body, "idempotency_key_reused") {
		t.Fatalf("different body: %d %s", status, body)
	}
	if n := countProjects(t, e, "canon"); n != 1 {
		t.Fatalf("%d projects named canon", n)
	}
	var stored int
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'c14n'`).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("stored keys %d, %v", stored, err)
	}
}

// TestKeyStoredBeforeCanonicalFormStillReplays: a key stored with the raw-bytes
// fingerprint (before this release) still matches the same bytes until it expires.
func TestKeyStoredBeforeCanonicalFormStillReplays(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Legacy")
	ctx := context.Background()

	body := `{"name":"legacy"}`
	status, first := read(t, createProject(e, ten.AdminToken, "old-key", body))
	if status != 201 {
		t.Fatalf("first: %d %s", status, first)
	}
	// Rewrite the stored fingerprint to the pre-release form: raw bytes.
	legacy := sha256.Sum256([]byte("POST\x00/api/v1/projects\x00" + body))
	tag, err := e.Pool.Exec(ctx, `UPDATE idempotency_keys SET request_hash = $1 WHERE idempotency_key = 'old-key'`, legacy[:])
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("rewrite fingerprint: %v %v", tag, err)
	}
	resp := createProject(e, ten.AdminToken, "old-key", body)
	replayed := resp.Header.Get("Idempotent-Replayed")
	if status, b := read(t, resp); status != 201 || replayed != "true" || b != first {
		t.Fatalf("legacy key: %d replayed=%q %s", status, replayed, b)
	}
	// The legacy fingerprint matches the same bytes only.
	status, b := read(t, createProject(e, ten.AdminToken, "old-key", `{ "name": "legacy" }`))
	if status != 422 || !strings.Contains(b, "idempotency_key_reused") {
		t.Fatalf("legacy key, other bytes: %d %s", status, b)
	}
	if n := countProjects(t, e, "legacy"); n != 1 {
		t.Fatalf("%d projects named legacy", n)
	}
}

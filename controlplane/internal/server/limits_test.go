package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
)

// The contract's limits on project names and slugs (seed §8), at their edges.
func TestProjectNameAndSlugLimits(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Limits")
	cases := []struct {
		name, body string
		status     int
		field      string
	}{
		{"name 120", fmt.Sprintf(`{"name":%q}`, strings.Repeat("n", 120)), 201, ""},
		{"name 121", fmt.Sprintf(`{"name":%q}`, strings.Repeat("n", 121)), 422, "name"},
		{"name empty", `{"name":""}`, 422, "name"},
		{"name missing", `{}`, 422, "name"},
		{"slug 2 chars", `{"name":"a","slug":"ab"}`, 201, ""},
		{"slug 63 chars", fmt.Sprintf(`{"name":"b","slug":%q}`, "s"+strings.Repeat("x", 62)), 201, ""},
		{"slug 64 chars", fmt.Sprintf(`{"name":"c","slug":%q}`, "s"+strings.Repeat("x", 63)), 422, "slug"},
		{"slug 1 char", `{"name":"d","slug":"a"}`, 422, "slug"},
		{"slug uppercase", `{"name":"e","slug":"Abc"}`, 422, "slug"},
		{"slug leading dash", `{"name":"f","slug":"-abc"}`, 422, "slug"},
		{"department not uuid", `{"name":"g","department_id":"x"}`, 422, "department_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before int
			if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM projects`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			resp := e.Do(e.Request("POST", "/api/v1/projects", ten.AdminToken, tc.body))
			if tc.status == 201 {
				resp.Body.Close()
				if resp.StatusCode != 201 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				return
			}
			env := expectError(t, resp, tc.status, "validation_error")
			if env.Details["field"] != tc.field {
				t.Fatalf("field %v, want %s (%s)", env.Details["field"], tc.field, env.Message)
			}
			var after int
			if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM projects`).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Fatalf("refused create persisted a row: %d -> %d", before, after)
			}
		})
	}
}

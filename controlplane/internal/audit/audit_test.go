package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestAuditIsAppendOnlyInTheDatabase(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	e.NewTenant(t, adminTok, "Audited") // writes tenant.create
	ctx := context.Background()
	var n int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_events`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("no audit rows: %d %v", n, err)
	}
	// Twice over: the application's role (e.Pool) has no UPDATE, DELETE or TRUNCATE on
	// the table, and even the owner, who has, is refused by the trigger.
	owner, err := pgx.Connect(ctx, testenv.OwnerURL(t, e.Pool.Config().ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, stmt := range []string{
		`UPDATE audit_events SET action = 'tampered'`,
		`DELETE FROM audit_events`,
		`TRUNCATE audit_events`,
	} {
		_, err := e.Pool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if ok := errorAs(err, &pgErr); !ok || pgErr.Code != "42501" || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("%s as the application role: %v, want 42501 permission denied", stmt, err)
		}
		_, err = owner.Exec(ctx, stmt)
		if err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Fatalf("%s as the owner: err %v", stmt, err)
		}
		if ok := errorAs(err, &pgErr); !ok || pgErr.Code != "42501" {
			t.Fatalf("%s as the owner: code %v", stmt, err)
		}
	}
	var after int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE action <> 'tampered'`).Scan(&after); err != nil || after != n {
		t.Fatalf("rows changed: %d -> %d (%v)", n, after, err)
	}
}

func list(t *testing.T, e *apitest.Env, token, query string) (int, api.AuditEventListResponse, string) {
	t.Helper()
	resp := e.Do(e.Request("GET", "/api/v1/admin/audit"+query, token, ""))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out api.AuditEventListResponse
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, out, string(body)
}

func TestAuditListSortsAndBindsCursors(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Listing")
	for i := 0; i < 4; i++ {
		req := e.Request("POST", "/api/v1/projects", ten.AdminToken, fmt.Sprintf(`{"name":"p%d"}`, i))
		e.Do(req).Body.Close()
	}
	_, all, body := list(t, e, adminTok, "?page_size=200&sort=occurred_at_asc")
	if len(all.Items) < 5 {
		t.Fatalf("only %d events: %s", len(all.Items), body)
	}
	for _, sortName := range []string{"occurred_at_desc", "occurred_at_asc", "action_asc", "action_desc", "result_asc", "target_desc"} {
		var seen []api.AuditEvent
		cursor := ""
		for page := 0; page < 20; page++ {
			q := "?page_size=2&sort=" + sortName
			if cursor != "" {
				q += "&cursor=" + cursor
			}
			status, out, body := list(t, e, adminTok, q)
			if status != 200 {
				t.Fatalf("%s page %d: %d %s", sortName, page, status, body)
			}
			seen = append(seen, out.Items...)
			if out.Pagination.NextCursor == nil {
				break
			}
			cursor = *out.Pagination.NextCursor
			// The cursor belongs to its sort: another sort refuses it.
			other := "action_asc"
			if sortName == other {
				other = "occurred_at_desc"
			}
			status, _, body = list(t, e, adminTok, "?sort="+other+"&cursor="+cursor)
			if status != 400 || !strings.Contains(body, "cursor_sort_mismatch") {
				t.Fatalf("cursor of %s used with %s: %d %s", sortName, other, status, body)
			}
		}
		if len(seen) != len(all.Items) {
			t.Fatalf("%s: paged %d events, total %d", sortName, len(seen), len(all.Items))
		}
		ids := map[string]bool{}
		for _, ev := range seen {
			if ids[ev.ID.String()] {
				t.Fatalf("%s: event %s twice", sortName, ev.ID)
			}
			ids[ev.ID.String()] = true
		}
		key := func(ev api.AuditEvent) string {
			switch {
			case strings.HasPrefix(sortName, "action"):
				return ev.Action
			case strings.HasPrefix(sortName, "result"):
				return string(ev.Result)
			case strings.HasPrefix(sortName, "target"):
				return ev.TargetType
			}
			return ev.OccurredAt.Format("2006-01-02T15:04:05.000000")
		}
		desc := strings.HasSuffix(sortName, "_desc")
		if !sort.SliceIsSorted(seen, func(i, j int) bool {
			if desc {
				return key(seen[i]) > key(seen[j])
			}
			return key(seen[i]) < key(seen[j])
		}) {
			t.Fatalf("%s: not sorted", sortName)
		}
	}

	// Filters and authorization.
	_, out, _ := list(t, e, adminTok, "?action=project.create&page_size=200")
	for _, ev := range out.Items {
		if ev.Action != "project.create" || ev.CorrelationID == "" {
			t.Fatalf("filter leaked %+v", ev)
		}
	}
	if len(out.Items) < 4 {
		t.Fatalf("project.create events: %d", len(out.Items))
	}
	if status, _, body := list(t, e, ten.AdminToken, ""); status != 403 || !strings.Contains(body, "admin_required") {
		t.Fatalf("tenant admin read the platform audit log: %d %s", status, body)
	}
	if status, _, _ := list(t, e, adminTok, "?sort=bogus"); status != 422 {
		t.Fatalf("unknown sort: %d", status)
	}
}

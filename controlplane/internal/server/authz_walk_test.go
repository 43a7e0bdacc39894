package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/authz"
	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// TestAuthorizationBeforeValidation walks every operation of the contract with a caller
// its declared requirement (authz.Operations) refuses and a request that is wrong in
// every other way (garbage JSON body, bad query values, an over-long Idempotency-Key):
// the answer is the authorization error, exact status and code, and never a
// validation error naming the schema; an operation declared WithStepUp answers a caller
// its role admits but who has not stepped up step_up_required, equally before
// validation; nothing is persisted; every refusal is audited.
// Public operations (nothing to refuse) and those that check a credential of their own
// (WebSocket handshakes, the internal JWKS refresh: tested with their features) are
// skipped, each with its reason.
func TestAuthorizationBeforeValidation(t *testing.T) {
	e := apitest.New(t)
	ctx := context.Background()
	_, adminTok := e.PlatformAdmin(t) // never stepped up
	ten := e.NewTenant(t, adminTok, "Walk")
	// A tenant member who is a viewer of the tenant's default project.
	memberID, memberTok := e.NewUser(t, ten.AdminToken, "member")
	if r, err := e.Client(ten.AdminToken).AddProjectMemberWithResponse(ctx, ten.DefaultProject, &api.AddProjectMemberParams{},
		api.AddProjectMemberJSONRequestBody{UserID: memberID, Role: api.ProjectRoleViewer}); err != nil || r.StatusCode() != http.StatusCreated {
		t.Fatalf("add viewer: %v %s", err, r.Body)
	}
	lonerTok := e.Token(t, loner(t, e))

	before := rowCounts(t, e)
	c := e.App.Contract
	ops := c.Ops()
	sort.Slice(ops, func(i, j int) bool { return ops[i].ID < ops[j].ID })
	type refusal struct{ target, code string }
	var refused []refusal
	walked, stepUps := 0, 0
	for _, op := range ops {
		req := authz.For(op.ID)
		var (
			token   string
			project = ten.DefaultProject
			status  int
			codes   []apierr.Code
		)
		switch req.Kind {
		case authz.KindPublic:
			t.Logf("skip %s: public (%s)", op.ID, req.Why)
			continue
		case authz.KindOwnCredential:
			// A handshake or internal credential the chain does not know; its own code
			// refuses (tested with its feature: terminal, notifications, auth).
			t.Logf("skip %s: own credential (%s)", op.ID, req.Why)
			continue
		case authz.KindNode:
			token, status, codes = memberTok, http.StatusUnauthorized, []apierr.Code{apierr.TokenInvalid}
		case authz.KindAuthenticated:
			status, codes = http.StatusUnauthorized, []apierr.Code{apierr.TokenMissing}
		case authz.KindTenantMember:
			token, status, codes = lonerTok, http.StatusForbidden, []apierr.Code{apierr.InsufficientPermissions}
		case authz.KindTenantAdmin:
			token, status, codes = memberTok, http.StatusForbidden, []apierr.Code{apierr.InsufficientPermissions}
		case authz.KindProjectRole:
			token, status, codes = memberTok, http.StatusForbidden, []apierr.Code{apierr.InsufficientPermissions}
			if req.Role == projectctx.RoleViewer {
				project = uuid.New() // no role at all: a project the member is not in
			}
		case authz.KindProjectRoleOrGrant:
			// A viewer of the project without a grant on the bucket: refused a write; a
			// caller of no role and no grant is told the bucket does not exist.
			token, status, codes = memberTok, http.StatusForbidden, []apierr.Code{apierr.InsufficientPermissions}
			if req.Role == projectctx.RoleViewer {
				project, status, codes = uuid.New(), http.StatusNotFound, []apierr.Code{apierr.StorageObjectNotFound}
			}
		case authz.KindCapability:
			token, status, codes = ten.AdminToken, http.StatusForbidden, []apierr.Code{req.Code}
		default:
			t.Fatalf("%s: requirement kind %d", op.ID, req.Kind)
		}
		walked++
		got, code, body := sendInvalid(t, e, op, token, project)
		if op.Method == http.MethodHead && got == status && code == "" { // a HEAD answer has no body to carry the code
			code = codes[0]
		}
		if got != status || !slices.Contains(codes, code) {
			t.Errorf("%s %s (%s) as an under-privileged caller with an invalid request: %d %s, want %d %v: %s",
				op.Method, op.Path, op.ID, got, code, status, codes, body)
			continue
		}
		if status == http.StatusNotFound { // not a denial: nothing to audit
			continue
		}
		refused = append(refused, refusal{op.Method + " " + op.Path, string(code)})
		if !req.StepUp {
			continue
		}
		// A caller the role admits but who has not stepped up: step_up_required, also
		// before validation.
		token = ten.AdminToken
		if req.Kind == authz.KindCapability {
			token = adminTok
		}
		got, code, body = sendInvalid(t, e, op, token, ten.DefaultProject)
		if got != http.StatusForbidden || code != apierr.StepUpRequired {
			t.Errorf("%s (%s) without step-up with an invalid request: %d %s, want 403 step_up_required: %s", op.Path, op.ID, got, code, body)
			continue
		}
		refused = append(refused, refusal{op.Method + " " + op.Path, string(code)})
		stepUps++
	}
	if walked == 0 {
		t.Fatal("no operation walked")
	}
	t.Logf("%d operations walked (%d also without step-up), %d public or own-credential skipped", walked, stepUps, len(ops)-walked)

	if after := rowCounts(t, e); !mapsEqual(before, after) {
		t.Errorf("refused requests changed stored rows:\nbefore %v\nafter  %v", before, after)
	}

	// Every refusal is audited: one auth.denied row per operation and code.
	if err := e.App.Denials.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	rows := deniedRows(t, e)
	for _, r := range refused {
		find(t, rows, r.target, r.code)
	}
	admin := find(t, rows, "POST /api/v1/admin/tenants", string(apierr.AdminRequired))
	if admin.ActorUserID == nil || *admin.ActorUserID != ten.AdminID {
		t.Errorf("admin_required row of createTenant: %+v", admin)
	}
	del := find(t, rows, "DELETE /api/v1/projects/{project_id}", string(apierr.InsufficientPermissions))
	if del.ActorUserID == nil || *del.ActorUserID != memberID || del.ProjectID == nil || *del.ProjectID != ten.DefaultProject {
		t.Errorf("insufficient_permissions row of deleteProject: %+v", del)
	}
}

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// sendInvalid sends op with token (none when empty): ids in the path are fresh uuids
// (project_id is project), X-Project-ID names project, the body is not JSON, the query
// values are out of range and the Idempotency-Key of a create too long: everything a
// validator would refuse.
func sendInvalid(t *testing.T, e *apitest.Env, op *contract.Op, token string, project uuid.UUID) (int, apierr.Code, string) {
	t.Helper()
	path := pathParam.ReplaceAllStringFunc(op.Path, func(m string) string {
		switch name := m[1 : len(m)-1]; {
		case name == "project_id":
			return project.String()
		case strings.HasSuffix(name, "_id"):
			return uuid.NewString()
		default:
			return "no-such-" + name
		}
	})
	req := e.Request(op.Method, path+"?page_size=-7&cursor=not-a-cursor", token, `{"bogus": [1, 2,`)
	if op.ProjectHeader {
		req.Header.Set("X-Project-ID", project.String())
	}
	if op.Idempotent {
		req.Header.Set("Idempotency-Key", strings.Repeat("k", 1000))
	}
	resp := e.Do(req)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env struct {
		Code apierr.Code `json:"code"`
	}
	_ = json.Unmarshal(raw, &env)
	return resp.StatusCode, env.Code, string(raw)
}

// loner is a user outside any tenant without a platform role (the fixture writes the
// row: such users exist, e.g. after their tenant membership ends).
func loner(t *testing.T, e *apitest.Env) uuid.UUID {
	t.Helper()
	hash, err := auth.HashPassword(apitest.Password)
	if err != nil {
		t.Fatal(err)
	}
	id := e.App.IDs.New()
	now := e.App.Clock.Now()
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO users (id, username, display_name, password_hash, role, created_at, updated_at)
		VALUES ($1, $2, 'Loner', $3, 'user', $4, $4)`, id, "loner-"+id.String()[24:], hash, now); err != nil {
		t.Fatalf("seed user: %v", err)
	}
	return id
}

// rowCounts is the number of rows of every table but the audit log (where the refusals
// are meant to go).
func rowCounts(t *testing.T, e *apitest.Env) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	rows, err := e.Pool.Query(ctx, `SELECT quote_ident(table_name) FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name NOT IN ('audit_events', 'goose_db_version')`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(tables) < 10 {
		t.Fatalf("only %d tables visible: %v", len(tables), tables)
	}
	out := make(map[string]int64, len(tables))
	for _, name := range tables {
		var n int64
		if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM `+name).Scan(&n); err != nil {
			t.Fatalf("count %s: %v", name, err)
		}
		out[name] = n
	}
	return out
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

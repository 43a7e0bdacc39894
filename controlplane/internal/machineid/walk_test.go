package machineid_test

import (
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/authz"
	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
)

// TestMachineTokenWalk sends every bearer operation of the contract that is not open to
// machines (not a project-role or project-role-or-grant operation, not ForMachines) with the token of a service
// account that is admin of the tenant's default project, and a garbage body: each one is
// 403, admin_required on admin operations and insufficient_permissions elsewhere, before
// validation. A new tenant-wide or platform operation is thereby closed to machines
// unless its table line says otherwise.
func TestMachineTokenWalk(t *testing.T) {
	f := setup(t)
	e := f.e
	sa := call(t, e, "POST", "/api/v1/service-accounts", f.ten.AdminToken, map[string]any{
		"name": "walker", "project_roles": []map[string]string{{"project_id": f.ten.DefaultProject.String(), "role": "admin"}},
	}, "")
	want(t, "create service account", sa, 201, "")
	c := call(t, e, "POST", "/api/v1/service-accounts/"+sa.Str("id")+"/credentials", f.ten.AdminToken, map[string]any{"name": "walk"}, "")
	want(t, "credential", c, 201, "")
	g := grant(t, e, creds(c.Str("client_id"), c.Str("client_secret")))
	want(t, "grant", g, 200, "")
	tok := g.Str("access_token")

	param := regexp.MustCompile(`\{[a-z_]+\}`)
	ops := e.App.Contract.Ops()
	sort.Slice(ops, func(i, j int) bool { return ops[i].ID < ops[j].ID })
	walked := 0
	for _, op := range ops {
		req := authz.For(op.ID)
		if op.Security != contract.SecurityBearer || req.Kind == authz.KindProjectRole || req.Kind == authz.KindProjectRoleOrGrant || req.Machines ||
			req.Kind == authz.KindPublic || req.Kind == authz.KindOwnCredential {
			continue
		}
		want := "insufficient_permissions"
		if req.Kind == authz.KindCapability {
			want = string(req.Code)
		}
		path := param.ReplaceAllStringFunc(op.Path, func(p string) string {
			if p == "{project_id}" {
				return f.ten.DefaultProject.String()
			}
			return uuid.NewString()
		})
		r := e.Request(op.Method, path+"?page_size=-7", tok, `{"garbage":`)
		if op.ProjectHeader {
			r.Header.Set("X-Project-ID", f.ten.DefaultProject.String())
		}
		a := send(t, e, r)
		if a.Status != 403 || a.Str("code") != want {
			t.Errorf("%s %s (%s) with a machine token: %d %s, want 403 %s", op.Method, url.PathEscape(path), op.ID, a.Status, strings.TrimSpace(a.Raw), want)
		}
		walked++
	}
	if walked < 40 {
		t.Fatalf("only %d operations walked", walked)
	}
	t.Logf("%d operations refused to a machine token", walked)
}

package nodes_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
)

func wantError(t *testing.T, status int, body []byte, got int, code, reason string) {
	t.Helper()
	var e api.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if got != status || string(e.Code) != code || (reason != "" && e.Details["reason"] != reason) {
		t.Fatalf("got %d %s/%v, want %d %s/%s: %s", got, e.Code, e.Details["reason"], status, code, reason, body)
	}
}

// env starts a control plane whose node probe dials through a fake (the nodes of these
// tests are on private addresses this machine does not have; the policy still applies).
func env(t *testing.T, clk clock.Clock) (*apitest.Env, *fakeDialer) {
	d := &fakeDialer{}
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) {
		o.NodeProbeDialer = d
		if clk != nil {
			o.Clock = clk
		}
	}))
	return e, d
}

func createNode(t *testing.T, c *api.ClientWithResponses, name, addr string) api.Node {
	t.Helper()
	r, err := c.CreateNodeWithResponse(context.Background(), &api.CreateNodeParams{}, api.CreateNodeJSONRequestBody{Name: name, Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode() != 201 {
		t.Fatalf("create node: %d %s", r.StatusCode(), r.Body)
	}
	return *r.JSON201
}

func enrollmentToken(t *testing.T, c *api.ClientWithResponses, id uuid.UUID) string {
	t.Helper()
	r, err := c.CreateNodeEnrollmentTokenWithResponse(context.Background(), id, &api.CreateNodeEnrollmentTokenParams{})
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode() != 201 {
		t.Fatalf("enrollment token: %d %s", r.StatusCode(), r.Body)
	}
	return r.JSON201.EnrollmentToken
}

func enroll(t *testing.T, e *apitest.Env, tok string) *api.EnrollNodeHTTPResponse {
	t.Helper()
	r, err := e.Client("").EnrollNodeWithResponse(context.Background(), &api.EnrollNodeParams{},
		api.EnrollNodeJSONRequestBody{EnrollmentToken: tok, Hostname: "gpu-host-1", AgentVersion: "0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func introspect(t *testing.T, e *apitest.Env, nodeToken, nodeID string) *api.IntrospectNodeTokenHTTPResponse {
	t.Helper()
	r, err := e.Client(nodeToken).IntrospectNodeTokenWithResponse(context.Background(), nodeID, &api.IntrospectNodeTokenParams{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAPIEnrollmentEndToEnd(t *testing.T) {
	clk := clock.NewManual(time.Now().UTC().Truncate(time.Second))
	e, dialer := env(t, clk)
	ctx := context.Background()
	adminID, adminTok := e.PlatformAdmin(t)
	admin := e.Client(adminTok)

	n := createNode(t, admin, "gpu-a1", "10.20.0.5")
	if n.Status != api.NodeStatus("pending") || n.LastProbe == nil || !n.LastProbe.Reachable || dialer.count() != 1 {
		t.Fatalf("created %+v", n)
	}
	et := enrollmentToken(t, admin, n.ID)
	er := enroll(t, e, et)
	if er.StatusCode() != 201 || er.JSON201.NodeID != n.ID || len(er.JSON201.NodeToken) != 80 {
		t.Fatalf("enroll: %d %s", er.StatusCode(), er.Body)
	}
	nodeTok := er.JSON201.NodeToken

	// The node token works on introspection, for its own node only.
	ir := introspect(t, e, nodeTok, n.ID.String())
	if ir.StatusCode() != 200 || !ir.JSON200.Active || ir.JSON200.NodeID != n.ID || ir.JSON200.NodeName != "gpu-a1" {
		t.Fatalf("introspect: %d %s", ir.StatusCode(), ir.Body)
	}
	ir = introspect(t, e, "", n.ID.String())
	wantError(t, 401, ir.Body, ir.StatusCode(), "token_missing", "")
	ir = introspect(t, e, nodeTok[:len(nodeTok)-1]+"x", n.ID.String())
	wantError(t, 401, ir.Body, ir.StatusCode(), "token_invalid", "")
	ir = introspect(t, e, adminTok, n.ID.String()) // a user's JWT is not a node token
	wantError(t, 401, ir.Body, ir.StatusCode(), "token_invalid", "")
	ir = introspect(t, e, nodeTok, uuid.NewString())
	wantError(t, 403, ir.Body, ir.StatusCode(), "insufficient_permissions", "node_mismatch")
	// A node token does not open user operations: it is recognised as a token of
	// another kind (issue 18 item 10), not as a forgery.
	lr, err := e.Client(nodeTok).ListNodesWithResponse(ctx, &api.ListNodesParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, 401, lr.Body, lr.StatusCode(), "token_scope_invalid", "")

	// The enrollment token was single use.
	er = enroll(t, e, et)
	wantError(t, 401, er.Body, er.StatusCode(), "token_invalid", "")

	// Concurrent use of one fresh token: exactly one enrollment.
	et = enrollmentToken(t, admin, n.ID)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var reenrolled string
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := enroll(t, e, et)
			mu.Lock()
			codes[r.StatusCode()]++
			if r.StatusCode() == 201 {
				reenrolled = r.JSON201.NodeToken
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[201] != 1 || codes[401] != 5 {
		t.Fatalf("concurrent enroll: %v", codes)
	}
	// Re-enrolment replaced the first token.
	ir = introspect(t, e, nodeTok, n.ID.String())
	wantError(t, 401, ir.Body, ir.StatusCode(), "token_invalid", "")
	nodeTok = reenrolled

	// Rotation: the new token works, the old one is refused at once.
	rr, err := e.Client(nodeTok).RotateNodeTokenWithResponse(ctx, n.ID.String(), &api.RotateNodeTokenParams{})
	if err != nil || rr.StatusCode() != 200 || rr.JSON200.NodeToken == nodeTok {
		t.Fatalf("rotate: %v %d %s", err, rr.StatusCode(), rr.Body)
	}
	rotated := rr.JSON200.NodeToken
	ir = introspect(t, e, nodeTok, n.ID.String())
	wantError(t, 401, ir.Body, ir.StatusCode(), "token_invalid", "")
	if ir = introspect(t, e, rotated, n.ID.String()); ir.StatusCode() != 200 {
		t.Fatalf("rotated token: %d %s", ir.StatusCode(), ir.Body)
	}
	rr, _ = e.Client(rotated).RotateNodeTokenWithResponse(ctx, uuid.NewString(), &api.RotateNodeTokenParams{})
	wantError(t, 403, rr.Body, rr.StatusCode(), "insufficient_permissions", "node_mismatch")

	// Admin revocation.
	vr, err := admin.RevokeNodeTokenWithResponse(ctx, n.ID, &api.RevokeNodeTokenParams{})
	if err != nil || vr.StatusCode() != 200 || !vr.JSON200.Revoked {
		t.Fatalf("revoke: %v %d %s", err, vr.StatusCode(), vr.Body)
	}
	ir = introspect(t, e, rotated, n.ID.String())
	wantError(t, 401, ir.Body, ir.StatusCode(), "token_invalid", "")

	// An expired enrollment token.
	et = enrollmentToken(t, admin, n.ID)
	clk.Advance(nodes.DefaultEnrollmentTokenTTL + time.Second)
	er = enroll(t, e, et)
	wantError(t, 401, er.Body, er.StatusCode(), "token_expired", "")
	admin = e.Client(e.Token(t, adminID))
	gr, err := admin.GetNodeWithResponse(ctx, n.ID, &api.GetNodeParams{})
	if err != nil || gr.StatusCode() != 200 || gr.JSON200.EnrolledAt == nil || *gr.JSON200.Hostname != "gpu-host-1" {
		t.Fatalf("get: %v %d %s", err, gr.StatusCode(), gr.Body)
	}
	if e.Validated.Load() == 0 {
		t.Fatal("no response was validated against the contract")
	}
}

func TestAPIAdminNodes(t *testing.T) {
	e, dialer := env(t, nil)
	ctx := context.Background()
	_, adminTok := e.PlatformAdmin(t)
	admin := e.Client(adminTok)

	// A denied probe target: 400, nothing stored, no connection. The metadata names are
	// refused by name: this machine cannot resolve them, which once stored the node (201).
	for _, addr := range []string{"169.254.169.254", "2852039166", "0251.0376.0251.0376", "127.0.0.1", "[::1]", "::ffff:169.254.169.254", "fd00:ec2::254", "100.100.100.200",
		"metadata.google.internal", "Metadata.Google.Internal.", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal", "metadata.azure.internal", "localhost"} {
		r, err := admin.CreateNodeWithResponse(ctx, &api.CreateNodeParams{}, api.CreateNodeJSONRequestBody{Name: "evil", Address: addr})
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, 400, r.Body, r.StatusCode(), "invalid_request", "probe_target_denied")
	}
	if dialer.count() != 0 {
		t.Fatalf("denied targets were dialled: %v", dialer.dials)
	}
	n := createNode(t, admin, "gpu-b1", "10.20.0.6")
	r, _ := admin.CreateNodeWithResponse(ctx, &api.CreateNodeParams{}, api.CreateNodeJSONRequestBody{Name: "gpu-b1", Address: "10.20.0.7"})
	wantError(t, 409, r.Body, r.StatusCode(), "node_already_exists", "")
	r, _ = admin.CreateNodeWithResponse(ctx, &api.CreateNodeParams{}, api.CreateNodeJSONRequestBody{Name: "Not_A_Label", Address: "10.20.0.7"})
	wantError(t, 422, r.Body, r.StatusCode(), "validation_error", "")

	lr, err := admin.ListAdminNodesWithResponse(ctx, &api.ListAdminNodesParams{})
	if err != nil || lr.StatusCode() != 200 || len(lr.JSON200.Items) != 1 {
		t.Fatalf("list: %v %d %s", err, lr.StatusCode(), lr.Body)
	}
	port := 2200
	ur, err := admin.UpdateNodeWithResponse(ctx, n.ID, &api.UpdateNodeParams{}, api.UpdateNodeJSONRequestBody{ProbePort: &port})
	if err != nil || ur.StatusCode() != 200 || ur.JSON200.ProbePort != 2200 || dialer.dials[len(dialer.dials)-1] != "10.20.0.6:2200" {
		t.Fatalf("update: %v %d %s", err, ur.StatusCode(), ur.Body)
	}
	pr, err := admin.ProbeNodeWithResponse(ctx, n.ID, &api.ProbeNodeParams{})
	if err != nil || pr.StatusCode() != 200 || !pr.JSON200.Reachable || *pr.JSON200.Address != "10.20.0.6:2200" {
		t.Fatalf("probe: %v %d %s", err, pr.StatusCode(), pr.Body)
	}

	cr, _ := admin.DrainNodeWithResponse(ctx, n.ID, &api.DrainNodeParams{})
	if cr.StatusCode() != 200 || cr.JSON200.ScheduleState != "drained" {
		t.Fatalf("drain: %d %s", cr.StatusCode(), cr.Body)
	}
	cor, _ := admin.CordonNodeWithResponse(ctx, n.ID, &api.CordonNodeParams{})
	wantError(t, 409, cor.Body, cor.StatusCode(), "invalid_request", "schedule_transition_invalid")

	// Telemetry for the fleet of one DGX H100 (inventory as the mock reports it).
	if err := e.App.Nodes.NodeConnected(ctx, n.ID, dgxH100("gpu-b1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Nodes.NodeStatus(ctx, n.ID, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Nodes.NodeTelemetry(ctx, n.ID, samples(dgxH100("gpu-b1"), time.Now(), 77)); err != nil {
		t.Fatal(err)
	}
	fleetOf := func(c *api.ClientWithResponses) *api.GetFleetTelemetryHTTPResponse {
		fr, err := c.GetFleetTelemetryWithResponse(ctx, &api.GetFleetTelemetryParams{})
		if err != nil {
			t.Fatal(err)
		}
		return fr
	}
	fr := fleetOf(admin)
	if fr.StatusCode() != 200 || len(fr.JSON200.Totals) != 1 || len(fr.JSON200.Nodes) != 1 {
		t.Fatalf("fleet: %d %s", fr.StatusCode(), fr.Body)
	}
	if tot := fr.JSON200.Totals[0]; tot.Model != "NVIDIA H100 80GB HBM3" || tot.Total != 8 || tot.Unavailable != 8 || tot.Free != 0 {
		t.Fatalf("drained node totals %+v", tot)
	}
	if ur, _ := admin.UncordonNodeWithResponse(ctx, n.ID, &api.UncordonNodeParams{}); ur.StatusCode() != 200 {
		t.Fatalf("uncordon: %d %s", ur.StatusCode(), ur.Body)
	}
	fr = fleetOf(admin)
	tot, fn := fr.JSON200.Totals[0], fr.JSON200.Nodes[0]
	if tot.Total != 8 || tot.Free != 8 || tot.Allocated != 0 || tot.Unhealthy != 0 || fn.Status != "online" ||
		len(fn.Gpus) != 8 || fn.Gpus[0].Metrics == nil || fn.Gpus[0].Metrics.UtilizationPercent != 77 || *fn.AgentVersion != "1.0.0" {
		t.Fatalf("fleet %+v / %+v", tot, fn)
	}

	// Permissions: tenant admins are not platform admins; platform ops read nodes.
	ten := e.NewTenant(t, adminTok, "Acme")
	tenant := e.Client(ten.AdminToken)
	lr, _ = tenant.ListAdminNodesWithResponse(ctx, &api.ListAdminNodesParams{})
	wantError(t, 403, lr.Body, lr.StatusCode(), "admin_required", "")
	r, _ = tenant.CreateNodeWithResponse(ctx, &api.CreateNodeParams{}, api.CreateNodeJSONRequestBody{Name: "x", Address: "10.9.9.9"})
	wantError(t, 403, r.Body, r.StatusCode(), "admin_required", "")
	fr = fleetOf(tenant)
	wantError(t, 403, fr.Body, fr.StatusCode(), "admin_required", "")
	tr, _ := tenant.CreateNodeEnrollmentTokenWithResponse(ctx, n.ID, &api.CreateNodeEnrollmentTokenParams{})
	wantError(t, 403, tr.Body, tr.StatusCode(), "admin_required", "")
	nl, _ := tenant.ListNodesWithResponse(ctx, &api.ListNodesParams{})
	wantError(t, 403, nl.Body, nl.StatusCode(), "insufficient_permissions", "")

	ops := e.Client(opsUser(t, e))
	nl, err = ops.ListNodesWithResponse(ctx, &api.ListNodesParams{})
	if err != nil || nl.StatusCode() != 200 || len(nl.JSON200.Items) != 1 || nl.JSON200.Items[0].Gpus[0].Count != 8 {
		t.Fatalf("ops list: %v %d %s", err, nl.StatusCode(), nl.Body)
	}
	if fr = fleetOf(ops); fr.StatusCode() != 200 {
		t.Fatalf("ops fleet: %d %s", fr.StatusCode(), fr.Body)
	}
	lr, _ = ops.ListAdminNodesWithResponse(ctx, &api.ListAdminNodesParams{})
	wantError(t, 403, lr.Body, lr.StatusCode(), "admin_required", "")
	dr, _ := ops.DeleteNodeWithResponse(ctx, n.ID, &api.DeleteNodeParams{})
	wantError(t, 403, dr.Body, dr.StatusCode(), "admin_required", "")

	// Delete: online and schedulable is refused; cordoned, it goes.
	dr, _ = admin.DeleteNodeWithResponse(ctx, n.ID, &api.DeleteNodeParams{})
	wantError(t, 409, dr.Body, dr.StatusCode(), "node_in_use", "node_schedulable")
	if cr, _ := admin.CordonNodeWithResponse(ctx, n.ID, &api.CordonNodeParams{}); cr.StatusCode() != 200 {
		t.Fatal("cordon")
	}
	if dr, _ = admin.DeleteNodeWithResponse(ctx, n.ID, &api.DeleteNodeParams{}); dr.StatusCode() != http.StatusNoContent {
		t.Fatalf("delete: %d %s", dr.StatusCode(), dr.Body)
	}
	gr, _ := admin.GetNodeWithResponse(ctx, n.ID, &api.GetNodeParams{})
	wantError(t, 404, gr.Body, gr.StatusCode(), "node_not_found", "")
	if e.Validated.Load() == 0 {
		t.Fatal("no response was validated against the contract")
	}
}

// opsUser is a platform_ops user (role binding), who holds platform.node.read and
// platform.ops.read but not platform.admin.
func opsUser(t *testing.T, e *apitest.Env) string {
	t.Helper()
	id := e.App.IDs.New()
	now := e.App.Clock.Now()
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO users (id, username, display_name, created_at, updated_at)
		VALUES ($1, $2, 'Ops', $3, $3)`, id, "ops-"+id.String()[24:], now); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO platform_role_bindings (user_id, role, created_at) VALUES ($1, 'platform_ops', $2)`, id, now); err != nil {
		t.Fatal(err)
	}
	return e.Token(t, id)
}

// When the token store cannot answer, a node is told to retry (503), not that its token
// is bad (a 401 would make an agent give up on a good token).
func TestAPINodeAuthUnavailable(t *testing.T) {
	e, _ := env(t, nil)
	tok := "gnt_" + uuidHex(uuid.New()) + "_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	e.Pool.Close()
	ir := introspect(t, e, tok, uuid.NewString())
	wantError(t, 503, ir.Body, ir.StatusCode(), "service_unavailable", "")
}

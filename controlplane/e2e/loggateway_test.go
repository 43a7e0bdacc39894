package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grafana/loki/pkg/push"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/loggateway/gateway"
	"github.com/gantry-gpu/gantry/loggateway/lokitest"
	"github.com/gantry-gpu/gantry/nodeagent/logship"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// logGatewayEnrolledNode creates a node through the admin API, issues an enrollment token and
// enrolls with it through the node-facing API, as `gantry-nodeagent enroll` does.
func logGatewayEnrolledNode(t *testing.T, e *apitest.Env, adminToken, name, address string) (uuid.UUID, string) {
	t.Helper()
	ctx := context.Background()
	admin := e.Client(adminToken)
	created, err := admin.CreateNodeWithResponse(ctx, &api.CreateNodeParams{}, api.CreateNodeJSONRequestBody{Name: name, Address: address})
	if err != nil {
		t.Fatal(err)
	}
	if created.StatusCode() != http.StatusCreated {
		t.Fatalf("create node: %d %s", created.StatusCode(), created.Body)
	}
	nodeID := created.JSON201.ID
	et, err := admin.CreateNodeEnrollmentTokenWithResponse(ctx, nodeID, &api.CreateNodeEnrollmentTokenParams{})
	if err != nil {
		t.Fatal(err)
	}
	if et.StatusCode() != http.StatusCreated {
		t.Fatalf("enrollment token: %d %s", et.StatusCode(), et.Body)
	}
	enrolled, err := e.Client("").EnrollNodeWithResponse(ctx, &api.EnrollNodeParams{}, api.EnrollNodeJSONRequestBody{
		EnrollmentToken: et.JSON201.EnrollmentToken, Hostname: name + ".gpu.internal", AgentVersion: "0.1.0-test",
	})
	if err != nil {
		t.Fatal(err)
	}
	if enrolled.StatusCode() != http.StatusCreated {
		t.Fatalf("enroll: %d %s", enrolled.StatusCode(), enrolled.Body)
	}
	return nodeID, enrolled.JSON201.NodeToken
}

// TestLogGatewayAuthenticatesAgainstControlPlane runs the log gateway against the real
// control plane's token introspection: an enrolled node's batches are accepted and
// stamped with its node_id; a wrong, unknown, revoked or rotated-away token is 401
// rejected_auth.
func TestLogGatewayAuthenticatesAgainstControlPlane(t *testing.T) {
	e := apitest.New(t, apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = refusingProbeDialer{} }))
	_, adminToken := e.PlatformAdmin(t)
	nodeA, tokenA := logGatewayEnrolledNode(t, e, adminToken, "gpu-a", "10.20.0.7")
	nodeB, tokenB := logGatewayEnrolledNode(t, e, adminToken, "gpu-b", "10.20.0.8")

	loki := lokitest.New(t)
	clk := clock.NewManual(time.Now())
	cfg := gateway.DefaultConfig()
	cfg.LokiURL = loki.URL()
	cfg.ControlPlaneURL = e.Server.URL
	cp := gateway.NewControlPlane(cfg.ControlPlaneURL, cfg.IntrospectTimeout)
	cp.Client = e.HTTPClient() // every introspection answer is checked against the contract
	gw, err := gateway.New(cfg, gateway.Options{Introspector: cp, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)

	pushAs := func(token, claimedNode, line string) int {
		t.Helper()
		body := lokitest.Body(&push.PushRequest{Streams: []push.Stream{{
			Labels:  `{job="gantry-nodeagent", stream="agent", node_id="` + claimedNode + `"}`,
			Entries: []push.Entry{{Timestamp: time.Now(), Line: line}},
		}}})
		req, err := http.NewRequest(http.MethodPost, srv.URL+gateway.PushPath, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-protobuf")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	outcome := func(o gateway.Outcome) int {
		return int(testutil.ToFloat64(gw.Metrics().Batches.WithLabelValues(string(o))))
	}

	// Node A speaks, claiming to be node B: accepted, and stamped as A.
	if s := pushAs(tokenA, nodeB.String(), "from a"); s != http.StatusNoContent {
		t.Fatalf("enrolled node A: %d", s)
	}
	if s := pushAs(tokenB, nodeB.String(), "from b"); s != http.StatusNoContent {
		t.Fatalf("enrolled node B: %d", s)
	}
	byLine := map[string]string{}
	for _, en := range loki.Entries() {
		byLine[en.Line] = en.Labels["node_id"]
	}
	if byLine["from a"] != nodeA.String() || byLine["from b"] != nodeB.String() {
		t.Fatalf("stamped node ids: %v (a=%s b=%s)", byLine, nodeA, nodeB)
	}

	// Wrong secret for a real node, a token of a node that does not exist, a garbage
	// token, no token: all 401 rejected_auth, none forwarded.
	wrong, _ := nodetoken.New(nodeA, rand.Reader)
	ghost, _ := nodetoken.New(uuid.Must(uuid.NewV7()), rand.Reader)
	for name, tok := range map[string]string{"wrong secret": wrong, "unknown node": ghost, "garbage": "gnt_nope", "missing": ""} {
		if s := pushAs(tok, nodeA.String(), "refused "+name); s != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, s)
		}
	}
	if outcome(gateway.RejectedAuth) != 4 || outcome(gateway.Accepted) != 2 {
		t.Fatalf("outcomes: accepted %d rejected_auth %d", outcome(gateway.Accepted), outcome(gateway.RejectedAuth))
	}

	// Revoked by an admin: refused once the gateway's positive cache (30 s) has expired.
	ctx := context.Background()
	rev, err := e.Client(adminToken).RevokeNodeTokenWithResponse(ctx, nodeA, &api.RevokeNodeTokenParams{})
	if err != nil || rev.StatusCode() != http.StatusOK {
		t.Fatalf("revoke: %v %d %s", err, rev.StatusCode(), rev.Body)
	}
	clk.Advance(cfg.AuthCacheTTL + time.Second)
	if s := pushAs(tokenA, "", "after revoke"); s != http.StatusUnauthorized {
		t.Fatalf("revoked token: %d, want 401", s)
	}

	// Rotated by the node: the new token works at once, the old one no more.
	rot, err := e.Client(tokenB).RotateNodeTokenWithResponse(ctx, nodeB.String(), &api.RotateNodeTokenParams{})
	if err != nil || rot.StatusCode() != http.StatusOK {
		t.Fatalf("rotate: %v %d %s", err, rot.StatusCode(), rot.Body)
	}
	newB := rot.JSON200.NodeToken
	clk.Advance(cfg.AuthCacheTTL + time.Second)
	if s := pushAs(tokenB, "", "old token of b"); s != http.StatusUnauthorized {
		t.Fatalf("rotated-away token: %d, want 401", s)
	}
	if s := pushAs(newB, "", "new token of b"); s != http.StatusNoContent {
		t.Fatalf("rotated token: %d", s)
	}
	if outcome(gateway.RejectedAuth) != 6 || outcome(gateway.Accepted) != 3 {
		t.Fatalf("outcomes: accepted %d rejected_auth %d", outcome(gateway.Accepted), outcome(gateway.RejectedAuth))
	}
	for _, en := range loki.Entries() {
		if en.Line == "after revoke" || en.Line == "old token of b" || len(en.Line) > 7 && en.Line[:7] == "refused" {
			t.Errorf("%q was forwarded", en.Line)
		}
	}

	// The agent's shipper through the same gateway, with the node's real token.
	sh, err := logship.New(logship.Config{
		GatewayURL: srv.URL,
		Token:      func() string { return newB },
		Labels:     map[string]string{"job": "gantry-nodeagent"},
		BatchWait:  20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = sh.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	w := sh.TaskWriter(logship.StreamProvision, "task-1")
	_, _ = w.Write([]byte("provisioning started\n"))
	if !loki.WaitFor(10*time.Second, func(es []lokitest.Entry) bool {
		for _, en := range es {
			if en.Line == "provisioning started" {
				return en.Labels["node_id"] == nodeB.String() && en.Labels["stream"] == "provision" && en.Metadata["task_id"] == "task-1"
			}
		}
		return false
	}) {
		t.Fatalf("shipped line not delivered with node B's labels: %+v", loki.Entries())
	}
}

package e2e_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/nodeagent/config"
	"github.com/gantry-gpu/gantry/proto/api"
)

// syncBuffer is a log sink several goroutines (a process's stdout and stderr) write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// buildControlPlane compiles the real gantry-controlplane binary.
func buildControlPlane(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gantry-controlplane")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/gantry-gpu/gantry/controlplane/cmd/gantry-controlplane")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// freeAddr is a loopback address with a port free for TCP and UDP at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		if u, err := net.ListenPacket("udp", addr); err == nil {
			_ = u.Close()
			return addr
		}
	}
	t.Fatal("no free port")
	return ""
}

// cpProcess is the real gantry-controlplane binary serving the test's database, NATS
// streams and fabric CA (those of an apitest env, which the test uses for setup only).
type cpProcess struct {
	t    *testing.T
	bin  string
	env  []string
	url  string
	logs *syncBuffer
	cmd  *exec.Cmd
	done chan struct{}
}

func newCPProcess(t *testing.T, cfg app.Config, fabricAddr string) *cpProcess {
	t.Helper()
	mk := sha256.Sum256([]byte("gantry development master key: not a secret")) // auth.DevMasterKey, as apitest uses
	httpAddr := freeAddr(t)
	p := &cpProcess{t: t, bin: buildControlPlane(t), url: "http://" + httpAddr, logs: &syncBuffer{}}
	p.env = append(os.Environ(),
		"DATABASE_URL="+cfg.DatabaseURL, "NATS_URL="+cfg.NATSURL, "REDIS_URL=",
		"GANTRY_MASTER_KEY="+base64.StdEncoding.EncodeToString(mk[:]),
		"GANTRY_HTTP_ADDR="+httpAddr, "GANTRY_LOG_LEVEL=info",
		"GANTRY_RATE_LIMITS="+cfg.RateLimits,
		"GANTRY_EVENTS_STREAM="+cfg.EventsStream, "GANTRY_EVENTS_SUBJECT_PREFIX="+cfg.EventsSubjectPrefix,
		"GANTRY_FABRIC_ADDR="+fabricAddr, "GANTRY_FABRIC_PUBLIC_ADDR="+fabricAddr, "GANTRY_REPLICA_ID=crash-cp",
		"GANTRY_ALLOCATIONS_MAX_PER_PROJECT=64",
		"GANTRY_PROVISIONING_BACKOFF_MIN=200ms", "GANTRY_PROVISIONING_BACKOFF_MAX=2s",
		"NODE_PROBE_ALLOWED_CIDRS=",
	)
	t.Cleanup(p.kill)
	return p
}

// start runs the binary and waits until /readyz answers 200.
func (p *cpProcess) start() {
	p.t.Helper()
	fmt.Fprintf(p.logs, "---- control plane start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, "serve")
	cmd.Env, cmd.Stdout, cmd.Stderr = p.env, p.logs, p.logs
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(p.done)
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(p.url + "/readyz")
		if err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("control plane exited at start:\n%s", p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("control plane not ready:\n%s", p.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill sends SIGKILL (no graceful path: nothing in flight is finished or recorded) and
// reaps the process.
func (p *cpProcess) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	p.cmd = nil
}

func (p *cpProcess) client(token string) *api.ClientWithResponses {
	c, err := api.NewClientWithResponses(p.url, api.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}),
		api.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	if err != nil {
		p.t.Fatal(err)
	}
	return c
}

// agentProcess is the real gantry-nodeagent binary with the process runtime on mock
// H100s, over TCP (a killed control plane's sockets are reset at once).
type agentProcess struct {
	t      testing.TB
	bin    string
	cfg    config.Config
	nodeID uuid.UUID
	logs   *syncBuffer
	cmd    *exec.Cmd
	done   chan struct{}
}

func (c *cp) agentProcess(bin, name string) *agentProcess {
	c.t.Helper()
	ctx := context.Background()
	nodeID, tok := c.newNode(name)
	region := e2eRegion
	if r, err := c.client().UpdateNodeWithResponse(ctx, nodeID, &api.UpdateNodeParams{}, api.UpdateNodeJSONRequestBody{Region: &region}); err != nil || r.StatusCode() != 200 {
		c.t.Fatalf("node region: %v %s", err, r.Body)
	}
	e := c.enrollAgent(tok, name)
	e.cfg.Runtime, e.cfg.Transport, e.cfg.AdvertiseHost = "process", "tcp", name+".example"
	e.cfg.StateDir = filepath.Join(filepath.Dir(e.cfg.Path), "state")
	if err := config.Save(e.cfg.Path, e.cfg); err != nil {
		c.t.Fatal(err)
	}
	a := &agentProcess{t: c.t, bin: bin, cfg: e.cfg, nodeID: nodeID, logs: &syncBuffer{}}
	c.t.Cleanup(func() { a.stop(syscall.SIGTERM) })
	return a
}

func (a *agentProcess) start() {
	a.t.Helper()
	cmd := exec.Command(a.bin, "run", "--config", a.cfg.Path)
	cmd.Stdout, cmd.Stderr = a.logs, a.logs
	if err := cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.cmd, a.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(a.done)
}

func (a *agentProcess) stop(sig syscall.Signal) {
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Signal(sig)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
	a.cmd = nil
}

// workloads reads the runtime's records on the node: allocation id → its phase and GPUs.
func (a *agentProcess) workloads() map[string]runtimeRecord {
	out := map[string]runtimeRecord{}
	dir := filepath.Join(a.cfg.StateDir, "allocations")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // replaced by a rename while listing
		}
		var r runtimeRecord
		if json.Unmarshal(b, &r) == nil {
			out[r.AllocationID] = r
		}
	}
	return out
}

type runtimeRecord struct {
	AllocationID string `json:"allocation_id"`
	Phase        string `json:"phase"`
	GPUs         []struct {
		UUID string `json:"uuid"`
	} `json:"gpus"`
}

// liveGPUDoubles lists every GPU of the node that two live workloads (any phase but
// released) hold at once.
func (a *agentProcess) liveGPUDoubles() []string {
	owner := map[string]string{}
	var doubles []string
	for id, r := range a.workloads() {
		if r.Phase == "released" {
			continue
		}
		for _, g := range r.GPUs {
			if other, ok := owner[g.UUID]; ok {
				doubles = append(doubles, fmt.Sprintf("%s on %s and %s", g.UUID, other, id))
			}
			owner[g.UUID] = id
		}
	}
	return doubles
}

// TestControlPlaneKilledDuringCreateBurst is issue 18's reproduction made permanent: the
// real control-plane binary serves a burst of concurrent creates for real agents
// (process runtime, mock H100s) and is killed with SIGKILL partway, then restarted on
// the same database. Clients retry what got no answer with the same idempotency key.
// Then: every allocation answered 2xx exists exactly once, each one ends active (a
// result the agent wrote to the tunnel before the kill is not lost: it stays on the
// agent's disk until acknowledged, long before any report timeout), no GPU is ever held
// by two live workloads on a node (sampled throughout), and the ledger invariants hold.
// Then an agent is SIGKILLed, one of its allocations force-released while it is down,
// and the restarted agent's reconcile and cleanup task remove the workload; its GPU is
// held until then.
func TestControlPlaneKilledDuringCreateBurst(t *testing.T) {
	const agents, creates = 3, 18
	fabricAddr := freeAddr(t)
	env := apitest.New(t,
		apitest.WithOptions(func(o *app.Options) { o.NodeProbeDialer = refusingProbeDialer{} }),
		apitest.WithConfig(func(c *app.Config) { c.Fabric.PublicAddr = fabricAddr }))
	c := &cp{t: t, env: env, app: env.App, url: env.Server.URL}
	_, c.admin = env.PlatformAdmin(t)
	c.catalogForAllocations()
	ctx := context.Background()

	proc := newCPProcess(t, env.App.Config, fabricAddr)
	agentBin := buildAgent(t)
	nodes := make([]*agentProcess, agents)
	for i := range nodes {
		// Names of different lengths: newNode derives each node's address from it.
		nodes[i] = c.agentProcess(agentBin, "gpu-crash-"+strings.Repeat("x", i+1))
	}
	proc.start()
	for _, n := range nodes {
		n.start()
	}
	var fails []string
	defer func() {
		if t.Failed() {
			t.Logf("control plane log:\n%s", proc.logs.String())
			for _, n := range nodes {
				t.Logf("agent %s log:\n%s", n.cfg.Hostname, n.logs.String())
			}
		}
	}()
	eventually(t, "every agent online", func() bool {
		for _, n := range nodes {
			if f, ok := c.fleetNode(n.nodeID); !ok || f.Status != api.NodeStatusOnline || len(f.Gpus) != 8 {
				return false
			}
		}
		return true
	})

	// A tenant with a key and money.
	tenant := c.env.NewTenant(t, c.admin, "Crash")
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	keyLine := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
	if r, err := c.env.Client(tenant.AdminToken).CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: keyLine}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("ssh key: %v %s", err, r.Body)
	}
	if r, err := c.client().CreateBillingAdjustmentWithResponse(ctx, &api.CreateBillingAdjustmentParams{},
		api.BillingAdjustmentRequest{TenantID: tenant.ID, Amount: api.Money{AmountMinor: 10_000_000, Currency: "USD"}, Reason: "e2e credit"}); err != nil || r.StatusCode() != 201 {
		t.Fatalf("credit: %v %s", err, r.Body)
	}

	// No GPU on two live workloads, sampled on every node for the whole test.
	stopSampling := make(chan struct{})
	sampled := make(chan []string, 1)
	go func() {
		var seen []string
		for {
			for _, n := range nodes {
				seen = append(seen, n.liveGPUDoubles()...)
			}
			select {
			case <-stopSampling:
				sampled <- seen
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	checkSampled := func() {
		t.Helper()
		close(stopSampling)
		if d := <-sampled; len(d) > 0 {
			t.Fatalf("a GPU on two live workloads: %v", d)
		}
	}

	// The burst: every create with its own idempotency key. The control plane is frozen
	// (SIGSTOP) the moment the database shows provision tasks an agent acknowledged and
	// has not reported on: those agents finish them and write their results into the
	// frozen control plane's tunnel, where nothing records them; then it is killed
	// (SIGKILL). Before issue 18 the agent forgot a result once written, and those
	// allocations stayed provisioning until the report timeout.
	keys := make([]string, creates)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	var mu sync.Mutex
	got := map[int]uuid.UUID{} // request -> the allocation its 2xx named
	create := func(cl *api.ClientWithResponses, i int) (int, error) {
		r, err := cl.CreateAllocationWithResponse(ctx, &api.CreateAllocationParams{XProjectID: tenant.DefaultProject, IdempotencyKey: &keys[i]},
			api.CreateAllocationJSONRequestBody{Name: fmt.Sprintf("burst-%d", i), Sku: e2eSKU})
		if err != nil {
			return 0, err
		}
		if r.JSON201 != nil {
			mu.Lock()
			if prev, ok := got[i]; ok && prev != r.JSON201.ID {
				fails = append(fails, fmt.Sprintf("key %d answered %s then %s", i, prev, r.JSON201.ID))
			}
			got[i] = r.JSON201.ID
			mu.Unlock()
		}
		return r.StatusCode(), nil
	}
	cl := proc.client(tenant.AdminToken)
	var wg sync.WaitGroup
	unreported := func() []string {
		rows, err := env.Pool.Query(ctx, `SELECT t.task_id::text FROM allocation_tasks t JOIN allocations a ON a.id = t.allocation_id
			WHERE a.project_id = $1 AND t.kind = 'allocation.provision' AND t.acked_at IS NOT NULL AND t.finished_at IS NULL`, tenant.DefaultProject)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			out = append(out, id)
		}
		return out
	}
	allActive := func() bool {
		var n int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM allocations WHERE project_id = $1 AND status <> 'active'`, tenant.DefaultProject).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	}
	// Two rounds of creates: a round that ends with every allocation active before any
	// task was seen acknowledged and unreported (a very fast machine) is followed by the
	// next; the requests of a round not sent before the kill are sent after the restart.
	var caught []string
	for _, round := range [][2]int{{0, creates * 2 / 3}, {creates * 2 / 3, creates}} {
		var rwg sync.WaitGroup
		for i := round[0]; i < round[1]; i++ {
			wg.Add(1)
			rwg.Add(1)
			go func() {
				defer wg.Done()
				defer rwg.Done()
				_, _ = create(cl, i) // no answer, or a 5xx: retried after the restart
			}()
		}
		roundDone := make(chan struct{})
		go func() { rwg.Wait(); close(roundDone) }()
		for deadline := time.Now().Add(60 * time.Second); len(caught) == 0; time.Sleep(2 * time.Millisecond) {
			if caught = unreported(); len(caught) > 0 {
				break
			}
			select {
			case <-roundDone:
				if allActive() {
					deadline = time.Time{}
				}
			default:
			}
			if time.Now().After(deadline) {
				break
			}
		}
		if len(caught) > 0 {
			break
		}
	}
	if len(caught) == 0 {
		t.Log("no provision task was ever seen acknowledged and unreported: the kill finds no result in flight this time")
	}
	if err := proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agents finished the tasks caught by the freeze", func() bool {
		finished := map[string]bool{}
		for _, n := range nodes {
			for _, line := range strings.Split(n.logs.String(), "\n") {
				if strings.Contains(line, `"msg":"task finished"`) {
					for _, id := range caught {
						if strings.Contains(line, `"task_id":"`+id+`"`) {
							finished[id] = true
						}
					}
				}
			}
		}
		return len(finished) == len(caught)
	})
	time.Sleep(300 * time.Millisecond) // the results go down the tunnels
	proc.kill()
	wg.Wait()
	t.Logf("control plane frozen with %d provision tasks acknowledged and unreported, then killed", len(caught))
	mu.Lock()
	before := len(got)
	mu.Unlock()
	t.Logf("%d of %d creates answered 2xx before the kill", before, creates)
	proc.start()

	// Clients retry every request that got no 2xx, with its key.
	cl = proc.client(tenant.AdminToken)
	for i := range creates {
		mu.Lock()
		_, done := got[i]
		mu.Unlock()
		for attempt := 0; !done; attempt++ {
			status, err := create(cl, i)
			if err == nil && status == 201 {
				break
			}
			if attempt == 50 {
				t.Fatalf("create %d after the restart: %d %v", i, status, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if len(fails) > 0 {
		t.Fatal(strings.Join(fails, "\n"))
	}

	// Every 2xx allocation exists exactly once, and every one ends active.
	ids := map[uuid.UUID]bool{}
	for _, id := range got {
		ids[id] = true
	}
	var total int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM allocations WHERE project_id = $1`, tenant.DefaultProject).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if len(ids) != creates || total != creates {
		t.Fatalf("%d distinct allocations answered for %d keys, %d in the database", len(ids), creates, total)
	}
	status := func() map[string]int {
		rows, err := env.Pool.Query(ctx, `SELECT status, count(*) FROM allocations WHERE project_id = $1 GROUP BY status`, tenant.DefaultProject)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var s string
			var n int
			if err := rows.Scan(&s, &n); err != nil {
				t.Fatal(err)
			}
			out[s] = n
		}
		return out
	}
	deadline := time.Now().Add(120 * time.Second) // far below the 30 min report timeout
	for status()["active"] != creates {
		if time.Now().After(deadline) {
			t.Fatalf("allocations not all active after the restart: %v", status())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Each active allocation is up on its node with exactly its GPU.
	rows, err := env.Pool.Query(ctx, `SELECT a.id, a.node_id, g.gpu_uuid FROM allocations a
		JOIN allocation_gpus g ON g.allocation_id = a.id AND g.released_at IS NULL WHERE a.project_id = $1`, tenant.DefaultProject)
	if err != nil {
		t.Fatal(err)
	}
	placed := map[uuid.UUID][2]string{}
	for rows.Next() {
		var id, node uuid.UUID
		var g string
		if err := rows.Scan(&id, &node, &g); err != nil {
			t.Fatal(err)
		}
		placed[id] = [2]string{node.String(), g}
	}
	rows.Close()
	if len(placed) != creates {
		t.Fatalf("%d allocations hold a GPU, want %d", len(placed), creates)
	}
	byNode := map[string]*agentProcess{}
	for _, n := range nodes {
		byNode[n.nodeID.String()] = n
	}
	for id, p := range placed {
		r, ok := byNode[p[0]].workloads()[id.String()]
		if !ok || r.Phase != "active" || len(r.GPUs) != 1 || r.GPUs[0].UUID != p[1] {
			t.Fatalf("allocation %s: the node's record %+v, want active on %s", id, r, p[1])
		}
	}
	checkLedger(t, env)

	// An agent killed with SIGKILL; one of its allocations is force-released while it is
	// down. Its GPU stays held until the restarted agent confirms the workload gone.
	var victim uuid.UUID
	var victimNode *agentProcess
	for id, p := range placed {
		victim, victimNode = id, byNode[p[0]]
		break
	}
	victimNode.stop(syscall.SIGKILL)
	if r, err := c.client().ForceReleaseAllocationWithResponse(ctx, victim, &api.ForceReleaseAllocationParams{}); err != nil || r.StatusCode() != 200 {
		t.Fatalf("force-release: %v %s", err, r.Body)
	}
	held := func() int {
		var n int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM allocation_gpus WHERE allocation_id = $1 AND released_at IS NULL`, victim).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := held(); n != 1 {
		t.Fatalf("force-released allocation's GPU held %d times while its node is down, want 1 (cleanup pending)", n)
	}
	victimNode.start()
	eventually(t, "the restarted agent removed the force-released workload and its GPU is free", func() bool {
		r, ok := victimNode.workloads()[victim.String()]
		return ok && r.Phase == "released" && held() == 0
	})
	checkSampled()
	checkLedger(t, env)
}

// checkLedger runs the billing ledger's invariants (billing/main_test.go) on the test's
// database.
func checkLedger(t *testing.T, env *apitest.Env) {
	t.Helper()
	for name, q := range map[string]string{
		"transactions sum to zero": `SELECT count(*) FROM (SELECT txn_id, currency FROM billing_ledger_entries
			GROUP BY txn_id, currency HAVING sum(amount_minor) <> 0) x`,
		"projection = sum of entries": `SELECT count(*) FROM billing_ledger_accounts a WHERE a.balance_minor IS NOT NULL
			AND a.balance_minor <> coalesce((SELECT sum(amount_minor) FROM billing_ledger_entries e WHERE e.account_id = a.id), 0)`,
		"wallets never negative": `SELECT count(*) FROM billing_ledger_accounts WHERE kind = 'tenant_wallet' AND balance_minor < 0`,
		"one open usage record per running allocation": `SELECT count(*) FROM (SELECT source_id FROM billing_usage_records
			WHERE source = 'allocation' AND bill_to IS NULL GROUP BY source_id HAVING count(*) > 1) x`,
	} {
		var n int
		if err := env.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n != 0 {
			t.Fatalf("ledger invariant %q: %d violations", name, n)
		}
	}
}

package main

// The allocations section (issue 5's benchmark):
//
//   - allocation create through the full HTTP path (JWT, project access, contract checks,
//     idempotency, the ordered pre-checks, placement with GPU reservation, outbox and
//     audit in one transaction), many clients at once, vs raw single-row PostgreSQL
//     inserts and vs the barest write endpoint (an HTTP POST that inserts one row in a
//     transaction of its own), both measured in the same run with the same concurrency;
//   - create-to-agent latency: creates paced at a fixed rate against simulated agents
//     on the real fabric, with the outbox relay and the PROVISIONING dispatcher running;
//     the time from sending the create to the agent receiving the provision task.
//
// Every node of the fleet has a simulated agent (a fleet of online nodes: each task is
// delivered once), and each round waits for its tasks to be delivered before the next
// measurement. The CPU used per create by this process and by the PostgreSQL backends
// is printed, with the whole machine's (every process: the NATS server, PostgreSQL's
// own background processes) and the rate those allow on this machine's cores: what
// bounds the creates on a small machine is CPU, and this says how far that bound is from
// the goal. GANTRY_BENCH_CPUPROFILE=<file> profiles the creates (of the last round);
// GANTRY_BENCH_PGLOG=1 has PostgreSQL log 20 sequential creates' statements with their
// durations (server log); GANTRY_BENCH_PGLOG=round every statement of the first round.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

const (
	benchRegion = "bench-1"
	benchSKU    = "h100-80gb-sxm.1x"
	benchModel  = "NVIDIA H100 80GB HBM3"
	benchUnit   = "gpu.h100"
)

// probeOK stands in for the node probe's network: the bench's nodes have addresses this
// machine does not have. Every dial "connects".
type probeOK struct{}

func (probeOK) DialContext(context.Context, string, string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	_ = c2.Close()
	return c1, nil
}

type allocTenant struct {
	project uuid.UUID
	token   string
}

// allocBench is the fleet and the tenants the allocation measurements use.
type allocBench struct {
	fx      *fixture
	base    string // the control plane's HTTP address
	tenants []allocTenant
	nodeSeq int
	nodeIDs []uuid.UUID
	agents  int // simulated agents connected

	mu   sync.Mutex
	recv map[string]time.Time // allocation id -> when its provision task first reached an agent
}

func runAllocations(ctx context.Context, fx *fixture, rounds, conc int) error {
	b := &allocBench{fx: fx, recv: map[string]time.Time{}}
	if err := b.catalog(ctx); err != nil {
		return err
	}
	// Spread creates over tenants as real traffic is: a project's creates serialize on
	// its concurrency check.
	for i := 0; i < conc; i++ {
		t, err := b.tenant(ctx, i)
		if err != nil {
			return err
		}
		b.tenants = append(b.tenants, t)
	}
	// The relay, the dispatcher, the fabric and the HTTP server, as in production.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = fx.app.Run(runCtx, ln) }()
	defer func() { stop(); <-done }()
	b.base = "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}}

	const perRound = 2000
	if err := b.nodes(runCtx, perRound/8); err != nil {
		return err
	}
	// Statistics as autovacuum keeps them in a running system: the database is minutes
	// old, and without them the planner takes the fleet's tables for empty.
	if _, err := fx.pool.Exec(ctx, `ANALYZE`); err != nil {
		return err
	}
	pgLog := func(on bool) error {
		stmt := `DO $$BEGIN EXECUTE format('ALTER DATABASE %I RESET log_min_duration_statement', current_database()); END$$`
		if on {
			stmt = `DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET log_min_duration_statement = 0', current_database()); END$$`
		}
		if _, err := fx.pool.Exec(ctx, stmt); err != nil {
			return err
		}
		fx.pool.Reset()
		return nil
	}
	if os.Getenv("GANTRY_BENCH_PGLOG") == "round" {
		// Diagnostics: PostgreSQL logs every statement of the first round (the creates
		// at full concurrency, then the tasks' delivery), with durations (server log).
		if err := pgLog(true); err != nil {
			return err
		}
	} else if os.Getenv("GANTRY_BENCH_PGLOG") != "" {
		// Diagnostics: PostgreSQL logs every statement of this database with its
		// duration while a few creates run one at a time (new connections only).
		if err := pgLog(true); err != nil {
			return err
		}
		_, _, ids, err := b.creates(client, 20, 1)
		if err != nil {
			return err
		}
		if err := pgLog(false); err != nil {
			return err
		}
		if err := b.forceRelease(ctx, ids); err != nil {
			return err
		}
	}
	fmt.Printf("\nallocations (%d clients over %d tenants, %d creates per round, %d rounds):\n", conc, len(b.tenants), perRound, rounds)
	var rates, raws, floors, drains, goCPU, pgCPU, natsCPU, machineCPU []float64
	var lat []time.Duration
	for r := 0; r < rounds; r++ {
		raw, err := rawInserts(ctx, fx, perRound, conc)
		if err != nil {
			return err
		}
		raws = append(raws, raw)
		floor, err := floorWrites(ctx, fx, perRound, conc)
		if err != nil {
			return err
		}
		floors = append(floors, floor)
		cpu0, err := b.cpu(ctx)
		if err != nil {
			return err
		}
		stopProfile := startProfile("GANTRY_BENCH_CPUPROFILE")
		rate, l, ids, err := b.creates(client, perRound, conc)
		stopProfile()
		if err != nil {
			return err
		}
		rates, lat = append(rates, rate), append(lat, l...)
		// The round's tasks reach their agents behind the creates (relay, dispatcher,
		// acknowledgements); the next measurement starts from a quiet system.
		drained, err := b.settle(ctx, ids)
		if err != nil {
			return err
		}
		drains = append(drains, drained.Seconds())
		cpu1, err := b.cpu(ctx)
		if err != nil {
			return err
		}
		if r == 0 && os.Getenv("GANTRY_BENCH_PGLOG") == "round" {
			// After the CPU reading: this closes the round's connections.
			if err := pgLog(false); err != nil {
				return err
			}
		}
		goCPU = append(goCPU, float64(cpu1.proc-cpu0.proc)/float64(time.Millisecond)/perRound)
		pgCPU = append(pgCPU, float64(cpu1.pg-cpu0.pg)/float64(time.Millisecond)/perRound)
		nats := -1.0 // no nats-server on this machine
		if cpu0.nats >= 0 && cpu1.nats >= 0 {
			nats = float64(cpu1.nats-cpu0.nats) / float64(time.Millisecond) / perRound
		}
		natsCPU = append(natsCPU, nats)
		machineCPU = append(machineCPU, float64(cpu1.machine-cpu0.machine)/float64(time.Millisecond)/perRound)
		if err := b.forceRelease(ctx, ids); err != nil {
			return err
		}
	}
	rate, raw := median(rates), median(raws)
	fmt.Printf("  POST /api/v1/allocations (full path)      %7.0f creates/s (goal >= 1000), latency p50 %s p99 %s (goal p99 <= 50ms)\n",
		rate, pct(lat, 50), pct(lat, 99))
	floor := median(floors)
	fmt.Printf("  raw PostgreSQL single-row inserts         %7.0f inserts/s, same concurrency; create / insert = %.2fx\n", raw, rate/raw)
	fmt.Printf("  HTTP POST inserting one row (no checks)   %7.0f requests/s, same clients; create / this = %.2fx\n", floor, rate/floor)
	fmt.Printf("  every task of the round at its agent and the outbox empty %.1fs after the last create\n", median(drains))
	fmt.Printf("  CPU per create, until then: this process %.2f ms (bench clients, server, relay, dispatcher, fabric, simulated agents), PostgreSQL backends %.2f ms, NATS server %s\n",
		median(goCPU), median(pgCPU), natsShare(median(natsCPU)))
	if m := median(machineCPU); m > 0 {
		// Everything runs on this machine's cores: a create cannot go faster, with every
		// part sharing them, than the cores' time over the CPU time it costs.
		fmt.Printf("  the whole machine (every process) %.2f ms per create: at most %.0f creates/s on its %d cores\n",
			m, float64(runtimeCPUs())*1000/m, runtimeCPUs())
	}

	return b.agentLatency(ctx, client)
}

// catalog creates the region, the SKU and a default price for its usage unit.
func (b *allocBench) catalog(ctx context.Context) error {
	a := b.fx.app
	cat := catalog.New(a.Pool, a.Clock, a.IDs, nil, nil)
	if _, err := cat.CreateRegion(ctx, catalog.RegionSpec{Code: benchRegion, Label: "Bench", IsDefault: true}); err != nil {
		return fmt.Errorf("region: %w", err)
	}
	if _, err := cat.CreateSKU(ctx, catalog.SKUSpec{ID: benchSKU, GPUModel: benchModel, GPUCount: 1, VCPU: 26, MemoryGiB: 225,
		DiskGiB: 2000, UsageUnit: benchUnit, Regions: []string{benchRegion}}); err != nil {
		return fmt.Errorf("sku: %w", err)
	}
	if _, err := a.Billing.CreatePlan(ctx, "bench-allocations", true, nil, []billing.PriceInput{{Unit: benchUnit, Currency: "USD", UnitPrice: "0.0007"}}); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}

// tenant provisions a tenant with a funded wallet and an SSH key for its admin.
func (b *allocBench) tenant(ctx context.Context, i int) (allocTenant, error) {
	a := b.fx.app
	var prov tenancy.Provisioned
	err := db.InTx(ctx, a.Pool, func(tx pgx.Tx) error {
		var err error
		prov, err = a.Tenancy.Provision(ctx, tx, tenancy.ProvisionInput{
			Kind: "organization", Name: fmt.Sprintf("Alloc bench %d", i),
			Admin: tenancy.NewUser{Username: fmt.Sprintf("alloc-bench-%d", i), Password: "bench password 123", TenantRole: "admin"},
		})
		return err
	})
	if err != nil {
		return allocTenant{}, fmt.Errorf("provision: %w", err)
	}
	if _, err := a.Billing.Adjust(ctx, billing.Adjustment{
		TenantID: prov.Tenant.ID, Money: billing.Money{AmountMinor: 1_000_000_000, Currency: "USD"},
		Reason: "bench credit", Reference: "bench:" + prov.Tenant.ID.String(),
	}); err != nil {
		return allocTenant{}, fmt.Errorf("credit: %w", err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	if _, err := a.SSHKeys.Create(ctx, prov.Admin.ID, prov.Tenant.ID, "bench", strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))); err != nil {
		return allocTenant{}, fmt.Errorf("ssh key: %w", err)
	}
	toks, err := a.Auth.IssueFor(ctx, prov.Admin.ID)
	if err != nil {
		return allocTenant{}, err
	}
	return allocTenant{project: prov.Project.ID, token: toks.AccessToken}, nil
}

// nodes enrolls n nodes of 8 H100s each through node administration's API and connects
// a simulated agent to each over the real fabric (TLS+yamux), which reports the
// inventory and acknowledges every task, as a fleet of online nodes does: each create's
// provision task is delivered once, as in production (an online node with no tunnel
// would have the dispatcher retry its tasks for the whole run).
func (b *allocBench) nodes(ctx context.Context, n int) error {
	a := b.fx.app
	region := benchRegion
	for i := 0; i < n; i++ {
		b.nodeSeq++
		name := fmt.Sprintf("bench-node-%d", b.nodeSeq)
		node, err := a.Nodes.Create(ctx, nodes.Spec{Name: name, Address: fmt.Sprintf("10.%d.%d.%d", 20+b.nodeSeq/65536, b.nodeSeq/256%256, b.nodeSeq%256), Region: &region})
		if err != nil {
			return fmt.Errorf("node: %w", err)
		}
		tok, err := a.Nodes.IssueEnrollmentToken(ctx, node.ID)
		if err != nil {
			return err
		}
		enr, err := a.Nodes.Enroll(ctx, tok.Token, name, "bench")
		if err != nil {
			return err
		}
		ag := fabrictest.NewAgent(a.Fabric.ListenAddr().String(), enr.NodeToken, a.Fabric.CAPEM(), fabricnet.ModeTCP)
		ag.Inventory = &fabricv1.Inventory{}
		for g := 0; g < 8; g++ {
			ag.Inventory.Gpus = append(ag.Inventory.Gpus, &fabricv1.GPU{Index: uint32(g), Uuid: fmt.Sprintf("GPU-%s-%d", name, g),
				Model: benchModel, MemoryBytes: 80 << 30, DriverVersion: "550.54.15", CudaVersion: "12.4", PciBusId: fmt.Sprintf("0000:%02x:00.0", g)})
		}
		ag.OnTask = b.onTask
		go func() { _ = ag.Run(ctx) }()
		select {
		case <-ag.Sessions:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("simulated agent %s did not connect", name)
		}
		b.nodeIDs = append(b.nodeIDs, node.ID)
		b.agents++
	}
	return nil
}

// onTask is every simulated agent's answer to a task: it records when the allocation's
// first task arrived and accepts it.
func (b *allocBench) onTask(t *fabricv1.TaskDispatch) *fabricv1.TaskAck {
	var p struct {
		AllocationID string `json:"allocation_id"`
	}
	_ = json.Unmarshal(t.GetPayload(), &p)
	now := time.Now()
	b.mu.Lock()
	if _, ok := b.recv[p.AllocationID]; !ok {
		b.recv[p.AllocationID] = now
	}
	b.mu.Unlock()
	return &fabricv1.TaskAck{TaskId: t.GetTaskId(), Status: fabricv1.TaskAckStatus_TASK_ACK_STATUS_ACCEPTED}
}

// creates sends n creates from conc clients (client i for tenant i) and returns the
// rate, every request's latency and the created ids. Any answer but 201 aborts.
func (b *allocBench) creates(client *http.Client, n, conc int) (float64, []time.Duration, []string, error) {
	var next atomic.Int64
	lat := make([]time.Duration, n)
	ids := make([]string, n)
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func(t allocTenant) {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || firstErr.Load() != nil {
					return
				}
				t0 := time.Now()
				id, err := b.create(client, t, fmt.Sprintf("bench-%d", i))
				lat[i] = time.Since(t0)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				ids[i] = id
			}
		}(b.tenants[c%len(b.tenants)])
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, nil, nil, err
	}
	return float64(n) / time.Since(start).Seconds(), lat, ids, nil
}

func (b *allocBench) create(client *http.Client, t allocTenant, name string) (string, error) {
	body, _ := json.Marshal(map[string]any{"name": name, "sku": benchSKU})
	req, _ := http.NewRequest("POST", b.base+"/api/v1/allocations", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+t.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Project-ID", t.project.String())
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 {
		return "", fmt.Errorf("create allocation: %d %s", resp.StatusCode, out)
	}
	var a struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(out, &a)
	return a.ID, nil
}

// cpuTimes is CPU time used so far: by this process, by the PostgreSQL backends serving
// this database, by the NATS server, and by the whole machine (read from /proc:
// PostgreSQL and NATS run on this machine; 0 when it cannot be read; nats is -1 when no
// nats-server runs here).
type cpuTimes struct{ proc, pg, nats, machine time.Duration }

func (b *allocBench) cpu(ctx context.Context) (cpuTimes, error) {
	var t cpuTimes
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		t.proc = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	rows, err := b.fx.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return t, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return t, err
	}
	for _, pid := range pids {
		t.pg += procCPU(int(pid))
	}
	t.nats = -1
	if pid := findProcess("nats-server"); pid > 0 {
		t.nats = procCPU(pid)
	}
	t.machine = machineBusy()
	return t, nil
}

// procCPU is the CPU time process pid has used (user and system), 0 when unknown.
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces): utime and stime are the
	// 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// findProcess is the pid of a process named comm on this machine, 0 when there is none.
func findProcess(comm string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(c)) == comm {
			return pid
		}
	}
	return 0
}

// machineBusy is the CPU time the machine's CPUs have spent busy (user, nice, system,
// irq and softirq: not idle, I/O wait or stolen), summed over CPUs; 0 when unknown.
func machineBusy() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// natsShare prints the NATS server's CPU per create, or why there is none.
func natsShare(ms float64) string {
	if ms < 0 {
		return "not on this machine"
	}
	return fmt.Sprintf("%.2f ms", ms)
}

// settle waits until the provision task of every one of ids reached its agent and the
// outbox has nothing left to publish, and returns how long that took (at most a minute).
func (b *allocBench) settle(ctx context.Context, ids []string) (time.Duration, error) {
	start := time.Now()
	for time.Since(start) < time.Minute {
		b.mu.Lock()
		missing := 0
		for _, id := range ids {
			if _, ok := b.recv[id]; !ok {
				missing++
			}
		}
		b.mu.Unlock()
		var pending int
		if err := b.fx.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE published_at IS NULL`).Scan(&pending); err != nil {
			return 0, err
		}
		if missing == 0 && pending == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start), nil
}

// forceRelease frees the GPUs of ids (between rounds; not measured) the way an admin
// would, so every round places onto the same free fleet, then vacuums and analyzes what
// the round wrote, as autovacuum keeps a running system (a round rewrites in seconds
// what production churns through in hours).
func (b *allocBench) forceRelease(ctx context.Context, ids []string) error {
	_, err := b.fx.pool.Exec(ctx, `UPDATE allocation_gpus SET released_at = now() WHERE released_at IS NULL AND allocation_id = ANY($1::uuid[])`, ids)
	if err != nil {
		return err
	}
	_, err = b.fx.pool.Exec(ctx, `UPDATE allocations SET status = 'released', ended_at = now() WHERE id = ANY($1::uuid[])`, ids)
	if err != nil {
		return err
	}
	_, err = b.fx.pool.Exec(ctx, `VACUUM ANALYZE allocations, allocation_gpus, allocation_tasks, allocation_events, outbox_events, audit_events, idempotency_keys`)
	return err
}

// rawTable is the table both baselines insert into.
const rawTable = `CREATE TABLE IF NOT EXISTS bench_alloc_raw_inserts (id uuid PRIMARY KEY, name text NOT NULL, created_at timestamptz NOT NULL)`

// rawInserts is the baseline: n single-row INSERTs (a uuid, a text, a timestamp) from
// conc goroutines, each its own autocommit transaction.
func rawInserts(ctx context.Context, fx *fixture, n, conc int) (float64, error) {
	if _, err := fx.pool.Exec(ctx, rawTable); err != nil {
		return 0, err
	}
	return inParallel(n, conc, func(int) error {
		_, err := fx.pool.Exec(ctx, `INSERT INTO bench_alloc_raw_inserts (id, name, created_at) VALUES ($1, $2, now())`, uuid.New(), "bench")
		return err
	})
}

// inParallel runs do(0) to do(n-1) from conc goroutines and returns the rate; the first
// error stops it.
func inParallel(n, conc int, do func(i int) error) (float64, error) {
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n && firstErr.Load() == nil; i = int(next.Add(1)) - 1 {
				if err := do(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// floorWrites is the barest write endpoint on this machine, the create's second baseline:
// n HTTP POSTs of a create's body from conc clients (the creates' client settings), each
// decoded and answered with JSON by net/http, and each inserting one row in a
// transaction of its own (BEGIN, INSERT, COMMIT) — no authentication, no checks, no
// events. Whatever a create must do comes on top of this.
func floorWrites(ctx context.Context, fx *fixture, n, conc int) (float64, error) {
	if _, err := fx.pool.Exec(ctx, rawTable); err != nil {
		return 0, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name string `json:"name"`
			SKU  string `json:"sku"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := uuid.New()
		err := pgx.BeginFunc(r.Context(), fx.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), `INSERT INTO bench_alloc_raw_inserts (id, name, created_at) VALUES ($1, $2, now())`, id, in.Name)
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"id": id.String(), "name": in.Name, "sku": in.SKU})
	})}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}}
	defer client.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/"
	return inParallel(n, conc, func(i int) error {
		body, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("floor-%d", i), "sku": benchSKU})
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		out, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("floor write: %d %s", resp.StatusCode, out)
		}
		return nil
	})
}

// agentLatency paces 1,000 creates at 100/s onto the fleet (free again: the rounds'
// creates were released) and measures create-sent to provision-task-received at the agent.
func (b *allocBench) agentLatency(ctx context.Context, client *http.Client) error {
	// 1,000 samples (10 s), so that the p99 is the tenth slowest rather than the
	// second slowest (128 samples made it swing from 12 to 62 ms between runs).
	const (
		rate  = 100
		total = 1000
	)
	var mu sync.Mutex
	sent := map[string]time.Time{} // allocation name -> when the create was sent
	names := map[string]string{}   // allocation id -> name
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for i := 0; i < total; i++ {
		<-tick.C
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := fmt.Sprintf("lat-%d", i)
			mu.Lock()
			sent[name] = time.Now()
			mu.Unlock()
			id, err := b.create(client, b.tenants[i%len(b.tenants)], name)
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
				return
			}
			mu.Lock()
			names[id] = name
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	received := func() (lat []time.Duration) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for id, name := range names {
			if at, ok := b.recv[id]; ok {
				lat = append(lat, at.Sub(sent[name]))
			}
		}
		return lat
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(received()) < total && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	lat := received()
	fmt.Printf("  create -> agent receives the task, %d creates at %d/s over %d simulated agents (TLS+yamux):\n", total, rate, b.agents)
	fmt.Printf("      %d/%d received; p50 %s p99 %s max %s (goal p99 <= 50ms)\n", len(lat), total, pct(lat, 50), pct(lat, 99), pct(lat, 100))
	return nil
}

// startProfile writes a CPU profile of what follows to the file named by env, if set;
// the returned func stops it.
func startProfile(env string) func() {
	path := os.Getenv(env)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return s[min(i, len(s))-1].Round(100 * time.Microsecond)
}

package main

// The app proxy benchmark (docs/app-proxy.md), `-only appproxy`, all on loopback in the
// same run: an app process (this binary, "appproxy-app") started by a real node agent's
// app supervisor, reached either straight on its port (the baseline) or through the
// proxy: HTTP client → control plane (bearer check, project access, instance read) →
// fabric stream → agent → app.
//
//   - added p99 of a small GET at a fixed 200 requests/s (open loop), proxy vs direct;
//   - a 1 GiB streamed download, proxy vs direct (throughput ratio);
//   - RSS of this process (the control plane and the agent's ends of the streams) per
//     1,000 open proxied WebSockets, held by a child process.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/apps/proxy"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/nodeagent/agent"
	nodeapps "github.com/gantry-gpu/gantry/nodeagent/apps"
	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	noderuntime "github.com/gantry-gpu/gantry/nodeagent/runtime"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// The child modes run before main's flags (init): the app, and the WebSocket holder.
func init() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case "appproxy-app":
		if err := appChild(); err != nil {
			fmt.Fprintln(os.Stderr, "appproxy-app:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "appproxy-websockets":
		if err := wsChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "appproxy-websockets:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

const (
	appSmall       = 1 << 10
	appBig         = 1 << 30
	appRate        = 200
	appWebSockets  = 1000
	appLatencyTime = 5 * time.Second
)

// appChild serves GET /small (1 KiB), GET /big (1 GiB of zeros... of a repeating block),
// and /ws (a WebSocket echo) on 127.0.0.1:$PORT.
func appChild() error {
	block := make([]byte, 256<<10)
	for i := range block {
		block[i] = byte(i * 7)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(block[:appSmall])
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(appBig))
		for n := 0; n < appBig; n += len(block) {
			if _, err := w.Write(block); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			if err := c.Write(context.Background(), typ, b); err != nil {
				return
			}
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:"+os.Getenv("PORT"))
	if err != nil {
		return err
	}
	return http.Serve(ln, mux)
}

// wsChild opens n WebSockets to url (bearer token), each with one echo, prints
// "ready", and holds them until stdin ends.
func wsChild(args []string) error {
	if len(args) != 3 {
		return errors.New("usage: appproxy-websockets N URL TOKEN")
	}
	n, _ := strconv.Atoi(args[0])
	h := http.Header{}
	h.Set("Authorization", "Bearer "+args[2])
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	conns := make([]*websocket.Conn, 0, n)
	ctx := context.Background()
	for i := 0; i < n; i++ {
		c, _, err := websocket.Dial(ctx, args[1], &websocket.DialOptions{HTTPHeader: h, HTTPClient: client})
		if err != nil {
			return fmt.Errorf("websocket %d: %w", i, err)
		}
		if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
			return err
		}
		if _, _, err := c.Read(ctx); err != nil {
			return err
		}
		conns = append(conns, c)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		_ = c.CloseNow()
	}
	return nil
}

// benchEnvs is the node's one live allocation (process runtime: this user).
type benchEnvs struct {
	alloc string
	env   noderuntime.SessionEnv
}

func (e benchEnvs) Session(id string) (noderuntime.SessionEnv, bool) { return e.env, id == e.alloc }

type benchGPU struct{}

func (benchGPU) Name() string { return "static" }
func (benchGPU) Inventory(context.Context) (gpu.Inventory, error) {
	return gpu.Inventory{DriverVersion: "550.54.15", CUDAVersion: "12.4", GPUs: []gpu.GPU{{
		Index: 0, UUID: "GPU-bench-0", Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 81920 << 20, PCIBusID: "0000:18:00.0",
		DriverVersion: "550.54.15", CUDAVersion: "12.4"}}}, nil
}
func (benchGPU) Sample(context.Context) ([]gpu.Metrics, error) {
	return []gpu.Metrics{{UUID: "GPU-bench-0", Healthy: true, SampledAt: time.Now()}}, nil
}
func (benchGPU) Close() error { return nil }

func runAppProxy(ctx context.Context, fx *fixture, rounds int) error {
	// A replica of its own on the run's database and NATS: its fabric is started and
	// stopped here, and a fabric server does not start twice (the allocations section
	// runs fx.app's whole Run later).
	cfg := fx.app.Config
	cfg.Fabric.Addr, cfg.Fabric.ReplicaID = "127.0.0.1:0", "bench-appproxy"
	a, err := app.New(ctx, cfg, obs.NewLogger(io.Discard, "bench", slog.LevelError), app.Options{Pool: fx.pool, NodeProbeDialer: probeOK{}})
	if err != nil {
		return err
	}
	defer a.Close()
	fctx, stopFabric := context.WithCancel(ctx)
	fdone := make(chan struct{})
	go func() { defer close(fdone); _ = a.Fabric.Run(fctx) }()
	defer func() { stopFabric(); <-fdone }()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := a.Fabric.WaitPresence(wctx); err != nil {
		return err
	}

	// A node with a real agent and its app supervisor.
	n, err := a.Nodes.Create(ctx, nodes.Spec{Name: "bench-app-node", Address: "10.77.0.1"})
	if err != nil {
		return err
	}
	et, err := a.Nodes.IssueEnrollmentToken(ctx, n.ID)
	if err != nil {
		return err
	}
	en, err := a.Nodes.Enroll(ctx, et.Token, "bench-host", "bench/1")
	if err != nil {
		return err
	}
	home, err := os.MkdirTemp("", "gantry-bench-app-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(home)
	alloc, instanceID := uuid.New(), uuid.New()
	sup, err := nodeapps.New(nodeapps.Options{Envs: benchEnvs{alloc: alloc.String(), env: noderuntime.SessionEnv{
		AllocationID: alloc.String(), User: "bench", Dir: home, Shell: "/bin/sh", Env: []string{"HOME=" + home}}}})
	if err != nil {
		return err
	}
	mux := tasks.NewMux()
	sup.Register(mux)
	sctx, stopSup := context.WithCancel(ctx)
	defer func() { stopSup(); sup.Wait() }()
	if err := sup.Restore(sctx); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.Fabric.CAPEM())
	ag, err := agent.New(agent.Options{
		Addr: a.Fabric.ListenAddr().String(), Transport: fabricnet.ModeTCP, TLS: &tls.Config{RootCAs: pool},
		Token: func() (string, error) { return en.NodeToken, nil }, AgentVersion: "bench/1", Hostname: "bench-host",
		GPU: benchGPU{}, Executor: mux, Reports: sup, Streams: nodeapps.Streams{Apps: sup},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	actx, stopAgent := context.WithCancel(ctx)
	adone := make(chan struct{})
	go func() { defer close(adone); _ = ag.Run(actx) }()
	defer func() { stopAgent(); <-adone }()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	port, code, err := sup.Start(&fabricv1.AppStartTask{AppInstanceId: instanceID.String(), AllocationId: alloc.String(),
		AppSlug: "bench-app", Version: "1", Command: []string{self, "appproxy-app"},
		HealthCheck: &fabricv1.AppHealthCheck{Type: "http", HttpPath: "/small"}})
	if err != nil {
		return fmt.Errorf("app start: %s %w", code, err)
	}
	defer func() { _ = sup.Stop(context.Background(), instanceID.String(), alloc.String(), 2*time.Second) }()
	deadline := time.Now().Add(time.Minute)
	for !appRunning(sup, instanceID.String()) || !ag.Status().Connected {
		if time.Now().After(deadline) {
			return errors.New("the bench app did not become healthy")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := fx.pool.Exec(ctx, `
INSERT INTO app_instances (id, tenant_id, project_id, owner_user_id, name, app_slug, app_version, app_name, allocation_id, node_id, port, state, run_spec, created_at, updated_at)
VALUES ($1, $2, $3, $4, 'bench', 'bench-app', '1', 'Bench app', $5, $6, $7, 'running', '{}'::jsonb, now(), now())`,
		instanceID, fx.tenantID, fx.projectID, fx.adminID, alloc, n.ID, port); err != nil {
		return err
	}

	js, err := jetstream.New(a.NATS)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Config{CodeBucket: a.Config.EventsStream + "_APP_PROXY_CODES"}, proxy.Deps{
		Instances: proxy.DBInstances{Pool: fx.pool}, Auth: auth.NewAuthenticator(a.Keys, a.Config.Auth, a.Clock),
		Projects: a.Tenancy, Streams: a.Terminal, JS: js, CookieKey: a.Config.Auth.MasterKey.Derive("gantry/app-proxy-cookie"),
		Registry: reg, Clock: a.Clock,
		// As deployed: every request is counted by the API's limiter (Redis when set).
		Limiter: a.Limiter,
	})
	if err != nil {
		return err
	}
	defer p.Close()
	cp := fx.serve(p.Mount(a.Handler))
	direct := fmt.Sprintf("http://127.0.0.1:%d/", port)
	through := cp + proxy.InstancePath(instanceID)

	fmt.Printf("\napp proxy (loopback; control plane → fabric (TLS+yamux) → node agent → app process; %d rounds):\n", rounds)
	// Added p99 at a fixed rate.
	var dp, pp [][2]time.Duration
	for i := 0; i < rounds; i++ {
		d, err := openLoop(direct+"small", "", appRate, appLatencyTime)
		if err != nil {
			return err
		}
		q, err := openLoop(through+"small", fx.token, appRate, appLatencyTime)
		if err != nil {
			return err
		}
		dp, pp = append(dp, d), append(pp, q)
	}
	opened := counterValue(reg, "app_proxy_streams_opened_total")
	d50, d99 := medianPair(dp)
	p50, p99 := medianPair(pp)
	fmt.Printf("  GET 1 KiB at %d req/s for %s: direct p50 %s p99 %s; proxy p50 %s p99 %s; added p99 %s (goal ≤ 2ms: %s)\n",
		appRate, appLatencyTime, d50, d99, p50, p99, p99-d99, goalVerdict(p99-d99 <= 2*time.Millisecond))
	fmt.Printf("    %.0f fabric streams opened for %d proxied requests (kept-alive streams carry the rest)\n", opened, rounds*(appRate*int(appLatencyTime.Seconds())+50))

	// 1 GiB download: straight, through the proxy, and through the bare chain of the same
	// hops (appproxy_ceiling.go), interleaved; the CPU of this process and of the app.
	// The app's pid as its supervisor recorded it (the app process is the agent's child).
	inst, _ := sup.Get(instanceID.String())
	appPID := inst.PID
	chains := make([]*bareChain, len(chainBuffers))
	for i, size := range chainBuffers {
		if chains[i], err = newBareChain(fmt.Sprintf("127.0.0.1:%d", port), size); err != nil {
			return err
		}
		defer chains[i].Close()
	}
	var dr, pr []transfer
	cr := make([][]transfer, len(chains))
	for i := 0; i < rounds; i++ {
		x, err := measuredDownload(direct+"big", "", appPID)
		if err != nil {
			return err
		}
		stopProfile := startProfile(fmt.Sprintf("GANTRY_BENCH_APPPROXY_DOWNLOAD%d_CPUPROFILE", i))
		y, err := measuredDownload(through+"big", fx.token, appPID)
		stopProfile()
		if err != nil {
			return err
		}
		dr, pr = append(dr, x), append(pr, y)
		for j, c := range chains {
			z, err := measuredDownload("http://"+c.Addr()+"/big", "", appPID)
			if err != nil {
				return err
			}
			cr[j] = append(cr[j], z)
		}
	}
	dm, pm := medianTransfer(dr), medianTransfer(pr)
	fmt.Printf("  1 GiB download: direct %.0f MB/s, proxy %.0f MB/s, ratio %.2fx (goal ≥ 0.5x: %s)\n",
		dm.bps/1e6, pm.bps/1e6, pm.bps/dm.bps, goalVerdict(pm.bps/dm.bps >= 0.5))
	fmt.Printf("    CPU of this process (client, control plane, agent) and the app, on %d cores:\n", runtimeCPUs())
	fmt.Printf("      direct:  %s\n      proxy:   %s\n", dm, pm)
	// The ceiling: the bare chain at whichever copy size costs less.
	var cm transfer
	for j, size := range chainBuffers {
		m := medianTransfer(cr[j])
		fmt.Printf("      bare chain, %3d KiB copies: %s\n", size>>10, m)
		if j == 0 || m.cpuPerGiB < cm.cpuPerGiB {
			cm = m
		}
	}
	fmt.Printf("    bare chain (the same hops with bare code: client → TCP relay → TLS over loopback → app; the cheaper copy size) %.2fx of direct; the proxy reaches %.2fx of its rate at %.2fx its CPU per GiB\n",
		cm.bps/dm.bps, pm.bps/cm.bps, pm.cpuPerGiB/cm.cpuPerGiB)
	// With every core busy a path moves cores/cost; direct's cost against the cheaper of
	// the chain's and the proxy's is then the most this chain can reach of direct.
	best := min(cm.cpuPerGiB, pm.cpuPerGiB)
	fmt.Printf("    CPU bound: a proxied GiB costs %.2fx a direct one (bare chain %.2fx), so with the cores saturated for both this chain moves at most %.2fx of direct; more only while direct leaves cores idle (it kept %.2f of %d busy)\n",
		pm.cpuPerGiB/dm.cpuPerGiB, cm.cpuPerGiB/dm.cpuPerGiB, dm.cpuPerGiB/best, dm.cores, runtimeCPUs())

	// RSS per 1,000 proxied WebSockets, held by a child process.
	debug.FreeOSMemory() // the downloads' buffers must not hide in the baseline
	before, heapBefore := rssBytes(), heapBytes()
	cmd := exec.Command(self, "appproxy-websockets", strconv.Itoa(appWebSockets), "ws"+strings.TrimPrefix(through, "http")+"ws", fx.token)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("websocket child: %q %v", line, err)
	}
	debug.FreeOSMemory()
	after, heapAfter := rssBytes(), heapBytes()
	active := p.ActiveWebSockets()
	_ = stdin.Close()
	_ = cmd.Wait()
	fmt.Printf("  %d open proxied WebSockets (%d counted by the proxy): RSS +%.1f MiB (%.1f KiB each), Go heap and stacks +%.1f MiB; this process holds the control plane and the node agent's ends of the streams\n",
		appWebSockets, active, float64(after-before)/(1<<20), float64(after-before)/1024/appWebSockets, float64(heapAfter-heapBefore)/(1<<20))
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("  load average during the run: %s", load)
	return nil
}

func appRunning(sup *nodeapps.Supervisor, id string) bool {
	for _, r := range sup.Reports() {
		if r.GetObjectId() == id {
			return r.GetState() == "running"
		}
	}
	return false
}

func goalVerdict(ok bool) string {
	if ok {
		return "meets"
	}
	return "MISSES"
}

// openLoop sends GETs at rate per second for dur (each at its scheduled time, whatever
// the previous answers did) and returns the p50 and p99 latency.
func openLoop(url, token string, rate int, dur time.Duration) ([2]time.Duration, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	one := func() (time.Duration, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("GET %s: %d", url, resp.StatusCode)
		}
		return time.Since(start), nil
	}
	for i := 0; i < 50; i++ { // warm-up: connections, caches
		if _, err := one(); err != nil {
			return [2]time.Duration{}, err
		}
	}
	n := int(dur.Seconds() * float64(rate))
	lat := make([]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; i < n; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			d, err := one()
			if err != nil {
				errs <- err
				return
			}
			lat[i] = d
		}(i)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return [2]time.Duration{}, err
	}
	slices.Sort(lat)
	return [2]time.Duration{lat[n/2], lat[n*99/100]}, nil
}

func medianPair(xs [][2]time.Duration) (time.Duration, time.Duration) {
	a, b := make([]time.Duration, len(xs)), make([]time.Duration, len(xs))
	for i, x := range xs {
		a[i], b[i] = x[0], x[1]
	}
	slices.Sort(a)
	slices.Sort(b)
	return a[len(a)/2], b[len(b)/2]
}

// download reads url whole and returns bytes per second.
func download(url, token string) (float64, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	buf := make([]byte, 256<<10)
	n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
	if err != nil || n != appBig {
		return 0, fmt.Errorf("download %s: %d bytes, %v", url, n, err)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heapBytes() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

func counterValue(g prometheus.Gatherer, name string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

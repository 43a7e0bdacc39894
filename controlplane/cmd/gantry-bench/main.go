// Command gantry-bench measures the control plane's request chain against baselines
// measured in the same run on the same machine (`make bench`):
//
//   - GET /api/v1/health through the full chain vs a bare net/http handler;
//   - GET /api/v1/projects/{id} through the full chain (JWT verification, project
//     access, contract checks, handler) vs a bare net/http handler that does one raw
//     pgx primary-key select of the same row, and vs that select alone in-process.
//
// Each pair runs interleaved for several rounds and reports medians, so drift of the
// machine affects both sides alike. Timing is only printed, never asserted.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/tenancy"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/natsenv"
	"github.com/gantry-gpu/gantry/shared/obs"
	"github.com/gantry-gpu/gantry/shared/pgcluster"
)

func main() {
	dur := flag.Duration("duration", 2*time.Second, "length of one measurement")
	rounds := flag.Int("rounds", 3, "interleaved rounds per pair (median reported)")
	conc := flag.Int("concurrency", 8, "concurrent clients")
	agents := flag.Int("fabric-agents", envInt("GANTRY_BENCH_FABRIC_AGENTS", 10000), "simulated agents for the fabric capacity run (env GANTRY_BENCH_FABRIC_AGENTS)")
	transport := flag.String("fabric-transport", envStr("GANTRY_BENCH_FABRIC_TRANSPORT", "tcp"), "transport of the simulated agents: tcp, quic or auto")
	spread := flag.Duration("fabric-reconnect-spread", 10*time.Second, "spread the simulated agents' reconnects over this long when the whole fleet lost its tunnels at once (fabrictest.Agent.ReconnectSpread; 0: 250-500 ms, like the real agent)")
	only := flag.String("only", os.Getenv("GANTRY_BENCH_ONLY"), "run only \"http\", \"billing\", \"invoices\", \"fabric\", \"allocations\", \"storage\", \"readmodels\", \"appproxy\" or \"maas\" (default: everything)")
	child := flag.Bool("fabric-child", false, "internal: run simulated agents (the capacity run's child process)")
	serverChild := flag.Bool("fabric-server-child", false, "internal: run the fabric server that the capacity run kills with SIGKILL")
	flag.Parse()
	if !*child {
		// The processes that hold a control plane (this one, and the fabric server child
		// of the SIGKILL run) collect garbage as gantry-controlplane serve does
		// (GANTRY_GC_PERCENT, default 200; GOGC wins); the simulated agents' process
		// keeps Go's default.
		gcPercent = app.ApplyGCPercent(benchGCPercent())
	}
	if *serverChild {
		if err := fabricServerChild(); err != nil {
			fmt.Fprintln(os.Stderr, "gantry-bench server child:", err)
			os.Exit(1)
		}
		return
	}
	if *child {
		if err := fabricChild(); err != nil {
			fmt.Fprintln(os.Stderr, "gantry-bench child:", err)
			os.Exit(1)
		}
		return
	}
	mode, err := fabricnet.ParseMode(*transport)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gantry-bench:", err)
		os.Exit(2)
	}
	benchOnly = *only
	fabricOptions = fabricOpts{agents: *agents, transport: mode, dur: *dur, rounds: *rounds, spread: *spread}
	if err := run(*dur, *rounds, *conc); err != nil {
		fmt.Fprintln(os.Stderr, "gantry-bench:", err)
		os.Exit(1)
	}
}

var (
	benchOnly     string
	fabricOptions fabricOpts
	// gcPercent is the garbage collector target of the control plane's processes.
	gcPercent int
)

// benchGCPercent is GANTRY_GC_PERCENT as the control plane reads it (default 200, 0:
// Go's default).
func benchGCPercent() int {
	if v, err := strconv.Atoi(os.Getenv("GANTRY_GC_PERCENT")); err == nil {
		return v
	}
	return 200
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

func envStr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(dur time.Duration, rounds, conc int) error {
	ctx := context.Background()
	fx, err := setup(ctx)
	if err != nil {
		return err
	}
	defer fx.close()
	if benchOnly == "fabric" {
		return runFabric(ctx, fx, fabricOptions)
	}
	if benchOnly == "billing" {
		return runBilling(ctx, fx, dur, rounds)
	}
	if benchOnly == "invoices" {
		return runInvoices(ctx, fx)
	}
	if benchOnly == "allocations" {
		return runAllocations(ctx, fx, rounds, conc)
	}
	if benchOnly == "storage" {
		return runStorage(ctx, fx, rounds)
	}
	if benchOnly == "readmodels" {
		return runReadModels(ctx, fx, rounds)
	}
	if benchOnly == "appproxy" {
		return runAppProxy(ctx, fx, rounds)
	}
	if benchOnly == "maas" {
		return runMaas(ctx, fx)
	}
	if err := runHTTP(ctx, fx, dur, rounds, conc); err != nil {
		return err
	}
	if err := runTokenGrant(ctx, fx, dur, rounds, conc); err != nil {
		return err
	}
	if benchOnly == "http" {
		return nil
	}
	if err := runBilling(ctx, fx, dur, rounds); err != nil {
		return err
	}
	if err := runReadModels(ctx, fx, rounds); err != nil {
		return err
	}
	if err := runFabric(ctx, fx, fabricOptions); err != nil {
		return err
	}
	if err := runStorage(ctx, fx, rounds); err != nil {
		return err
	}
	if err := runAppProxy(ctx, fx, rounds); err != nil {
		return err
	}
	// After the others: it leaves 1,000,000 rated usage lines and their invoices behind.
	if err := runInvoices(ctx, fx); err != nil {
		return err
	}
	// Last: it runs the whole app (relay, dispatcher, fabric) until it returns.
	return runAllocations(ctx, fx, rounds, conc)
}

func runHTTP(ctx context.Context, fx *fixture, dur time.Duration, rounds, conc int) error {

	chain := fx.serve(fx.app.Handler)
	bareHealth := fx.serve(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{\"ok\":true}\n"))
	}))
	rawSelect := fx.serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id uuid.UUID
		var name, slug string
		var created time.Time
		if err := fx.pool.QueryRow(r.Context(), `SELECT id, name, slug, created_at FROM projects WHERE id = $1`, fx.projectID).Scan(&id, &name, &slug, &created); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "name": name, "slug": slug, "created_at": created})
	}))

	fmt.Printf("gantry-bench: %d rounds x %s, %d concurrent clients, GOMAXPROCS=%d\n\n", rounds, dur, conc, runtimeProcs())
	healthPath := "/api/v1/health"
	projPath := "/api/v1/projects/" + fx.projectID.String()

	h := pair(rounds, func() float64 { return load(bareHealth+healthPath, "", dur, conc) },
		func() float64 { return load(chain+healthPath, "", dur, conc) })
	report("GET /api/v1/health", "bare net/http handler", h, 0.9)

	p := pair(rounds, func() float64 { return load(rawSelect+projPath, "", dur, conc) },
		func() float64 { return load(chain+projPath, fx.token, dur, conc) })
	report("GET /api/v1/projects/{id}", "net/http + raw pgx PK select", p, 0.5)

	inproc := median(repeat(rounds, func() float64 { return selectLoop(ctx, fx.pool, fx.projectID, dur, conc) }))
	fmt.Printf("  for reference: raw pgx PK select in-process, no HTTP: %.0f ops/s; chain / in-process = %.2fx\n",
		inproc, p[1]/inproc)
	return nil
}

type fixture struct {
	app       *app.App
	pool      *pgxpool.Pool
	projectID uuid.UUID
	tenantID  uuid.UUID
	adminID   uuid.UUID
	token     string
	cfg       app.Config // the app's, for a second app on the same database
	closers   []func()
	servers   []*http.Server
}

// setup starts a control plane on a fresh database (dropped at the end) and creates a
// tenant whose admin reads its default project.
func setup(ctx context.Context) (*fixture, error) {
	fx := &fixture{}
	base, ok := pgcluster.Discover(ctx, os.Getenv("DATABASE_URL"))
	if !ok {
		dir, _ := os.MkdirTemp("", "gantry-bench-pg-")
		_ = os.Chmod(dir, 0o755)
		c, err := pgcluster.Start(ctx, dir, pgcluster.Options{})
		if err != nil {
			return nil, fmt.Errorf("no PostgreSQL: %w", err)
		}
		fx.closers = append(fx.closers, func() { _ = c.Stop(); _ = os.RemoveAll(dir) })
		base = c.URL()
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "gantry_bench_" + hex.EncodeToString(suffix)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	fx.closers = append(fx.closers, func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	})
	cfgURL, _ := pgx.ParseConfig(base)
	cfgURL.Database = name
	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfgURL.User, cfgURL.Host, cfgURL.Port, name)
	if err := db.Migrate(ctx, url); err != nil {
		return nil, err
	}

	natsURL := os.Getenv("NATS_URL")
	if natsURL == "" {
		natsURL = natsenv.DefaultURL
		if !natsenv.HasJetStream(natsURL) {
			dir, _ := os.MkdirTemp("", "gantry-bench-nats-")
			s, err := natsenv.Embedded(dir)
			if err != nil {
				return nil, err
			}
			fx.closers = append(fx.closers, func() { s.Shutdown(); _ = os.RemoveAll(dir) })
			natsURL = s.URL()
		}
	}

	authCfg := auth.DefaultConfig()
	authCfg.MasterKey = auth.DevMasterKey()
	cfg := app.Config{
		DatabaseURL: url, NATSURL: natsURL, LogLevel: "error", MaxBodyBytes: 1 << 20,
		RateLimits:           "auth=100000000,admin=100000000,api=100000000,internal=100000000",
		IdempotencyRetention: 24 * time.Hour, EventsStream: "BENCH_" + hex.EncodeToString(suffix),
		EventsSubjectPrefix: "bench." + hex.EncodeToString(suffix) + ".events.", ShutdownTimeout: 5 * time.Second,
		Auth: authCfg,
		// Many tenants' creates in flight, no per-project cap in the way.
		Allocations: app.AllocationsConfig{MaxPerProject: 100000, ProvisioningTimeout: 10 * time.Minute},
		Fabric:      app.FabricConfig{StartupTTL: 5 * time.Minute},
		// Object bytes in a directory of the run's own unless GANTRY_STORAGE_* says otherwise.
		Blob: benchBlobConfig(fx),
	}
	a, err := app.New(ctx, cfg, obs.NewLogger(io.Discard, "bench", slog.LevelError), app.Options{NodeProbeDialer: probeOK{}})
	if err != nil {
		return nil, err
	}
	fx.app, fx.cfg = a, cfg
	fx.closers = append(fx.closers, a.Close)
	fx.pool = a.Pool

	var prov tenancy.Provisioned
	err = db.InTx(ctx, a.Pool, func(tx pgx.Tx) error {
		var err error
		prov, err = a.Tenancy.Provision(ctx, tx, tenancy.ProvisionInput{
			Kind: "organization", Name: "Bench",
			Admin: tenancy.NewUser{Username: "bench-admin", Password: "bench password 123", TenantRole: "admin"},
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}
	fx.projectID, fx.tenantID, fx.adminID = prov.Project.ID, prov.Tenant.ID, prov.Admin.ID
	toks, err := a.Auth.IssueFor(ctx, prov.Admin.ID)
	if err != nil {
		return nil, err
	}
	fx.token = toks.AccessToken
	return fx, nil
}

func (fx *fixture) serve(h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fx.servers = append(fx.servers, srv)
	return "http://" + ln.Addr().String()
}

func (fx *fixture) close() {
	for _, s := range fx.servers {
		_ = s.Close()
	}
	for i := len(fx.closers) - 1; i >= 0; i-- {
		fx.closers[i]()
	}
}

// load sends GETs from conc keep-alive clients for dur and returns successful
// requests per second; any non-200 answer aborts the run.
func load(url, token string, dur time.Duration, conc int) float64 {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	// Warm-up: open the keep-alive connections and fill caches before measuring.
	for i := 0; i < 50; i++ {
		get(client, url, token)
	}
	return throughput(dur, conc, func() { get(client, url, token) })
}

func get(c *http.Client, url, token string) {
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		panic(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		panic(fmt.Sprintf("GET %s: %d", url, resp.StatusCode))
	}
}

func selectLoop(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, dur time.Duration, conc int) float64 {
	return throughput(dur, conc, func() {
		var name string
		if err := pool.QueryRow(ctx, `SELECT name FROM projects WHERE id = $1`, id).Scan(&name); err != nil {
			panic(err)
		}
	})
}

// throughput runs op from conc goroutines for dur and returns operations per second.
func throughput(dur time.Duration, conc int, op func()) float64 {
	var n atomic.Int64
	deadline := time.Now().Add(dur)
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				op()
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// pair runs baseline and subject alternately and returns their medians.
func pair(rounds int, baseline, subject func() float64) [2]float64 {
	var b, s []float64
	for i := 0; i < rounds; i++ {
		b = append(b, baseline())
		s = append(s, subject())
	}
	return [2]float64{median(b), median(s)}
}

func repeat(rounds int, f func() float64) []float64 {
	out := make([]float64, rounds)
	for i := range out {
		out[i] = f()
	}
	return out
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func report(what, baseline string, r [2]float64, goal float64) {
	ratio := r[1] / r[0]
	verdict := "meets"
	if ratio < goal {
		verdict = "below"
	}
	fmt.Printf("%s\n  baseline (%s): %.0f req/s\n  full chain: %.0f req/s\n  ratio chain/baseline = %.2fx (goal >= %.1fx: %s)\n\n",
		what, baseline, r[0], r[1], ratio, goal, verdict)
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "missed"
}

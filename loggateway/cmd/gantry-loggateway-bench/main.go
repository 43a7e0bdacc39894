// Command gantry-loggateway-bench measures the node log gateway against a baseline
// measured in the same run on the same machine (`make bench`):
//
//   - forwarded throughput in MB/s (10^6 bytes) of decompressed log lines, through the
//     gateway (size caps, token check via HTTP introspection with its cache, decode,
//     node_id stamping, re-encode, forward, metrics) and through a bare
//     decode-and-forward server (read, snappy decode, unmarshal, marshal, snappy encode,
//     forward; nothing else), both as separate processes behind the same load generator
//     and the same fake Loki; the cost ratio is bare MB/s over gateway MB/s;
//   - the peak resident set (VmHWM) of a fresh gateway process, and of a fresh bare one,
//     while 100 clients push 1 MiB batches concurrently.
//
// The gateway and the baseline are this binary re-executed in a child role, so each is
// measured as its own process. Pairs run interleaved for several rounds and medians are
// reported, so drift of the machine affects both sides alike. Timing is only printed.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"

	"github.com/gantry-gpu/gantry/loggateway/gateway"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

const roleEnv = "GANTRY_LGBENCH_ROLE"

func main() {
	switch os.Getenv(roleEnv) {
	case "gateway":
		exitOn(childGateway())
	case "bare":
		exitOn(childBare())
	}
	dur := flag.Duration("duration", 2*time.Second, "length of one throughput measurement")
	rounds := flag.Int("rounds", 3, "interleaved rounds (median reported)")
	conc := flag.Int("concurrency", 8, "concurrent clients for throughput")
	memConc := flag.Int("mem-concurrency", 100, "concurrent clients for the memory measurement")
	memDur := flag.Duration("mem-duration", 3*time.Second, "length of the memory measurement")
	flag.Parse()
	exitOn(run(*dur, *rounds, *conc, *memConc, *memDur))
}

func exitOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "gantry-loggateway-bench:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// workload is a set of pre-encoded push bodies of about 1 MiB of log lines each.
type workload struct {
	bodies    [][]byte
	lineBytes []int64
}

func newWorkload(n int) workload {
	rng := rand.New(rand.NewPCG(1, 2))
	levels := []string{"info", "info", "info", "debug", "warn", "error"}
	msgs := []string{"pulled layer", "container started", "gpu telemetry sample", "heartbeat sent", "task acknowledged", "nvidia-smi reported", "mounted volume", "ssh key installed"}
	streams := []string{`{job="gantry-nodeagent", stream="agent"}`, `{job="gantry-nodeagent", stream="provision"}`, `{job="gantry-nodeagent", stream="runtime"}`}
	base := time.Now()
	var w workload
	for b := 0; b < n; b++ {
		req := push.PushRequest{}
		for _, l := range streams {
			req.Streams = append(req.Streams, push.Stream{Labels: l})
		}
		var lines int64
		for i := 0; lines < 1<<20; i++ {
			ts := base.Add(time.Duration(i) * time.Millisecond)
			line := fmt.Sprintf(`ts=%s level=%s msg=%q task_id=%s gpu=%d util=%d temp_c=%d mem_used_mib=%d`,
				ts.Format(time.RFC3339Nano), levels[rng.IntN(len(levels))], msgs[rng.IntN(len(msgs))],
				uuid.NewSHA1(uuid.NameSpaceOID, []byte(strconv.Itoa(rng.IntN(200)))), rng.IntN(8), rng.IntN(101), 30+rng.IntN(60), rng.IntN(81920))
			s := &req.Streams[rng.IntN(len(streams))]
			s.Entries = append(s.Entries, push.Entry{Timestamp: ts, Line: line})
			lines += int64(len(line))
		}
		raw, err := req.Marshal()
		if err != nil {
			panic(err)
		}
		w.bodies = append(w.bodies, snappy.Encode(nil, raw))
		w.lineBytes = append(w.lineBytes, lines)
	}
	return w
}

func run(dur time.Duration, rounds, conc, memConc int, memDur time.Duration) error {
	node := uuid.Must(uuid.NewV7())
	token, err := nodetoken.New(node, cryptoRand{})
	if err != nil {
		return err
	}
	loki := newFakeLoki(node)
	defer loki.close()
	cp := newFakeControlPlane(node, token)
	defer cp.Close()

	w := newWorkload(8)
	var wire, lines int64
	for i := range w.bodies {
		wire += int64(len(w.bodies[i]))
		lines += w.lineBytes[i]
	}
	fmt.Printf("gantry-loggateway-bench: %d rounds x %s, %d concurrent clients, GOMAXPROCS=%d\n", rounds, dur, conc, runtime.GOMAXPROCS(0))
	fmt.Printf("workload: %d batches, %.2f MB of lines each on average, snappy ratio %.1fx\n\n",
		len(w.bodies), float64(lines)/float64(len(w.bodies))/1e6, float64(lines)/float64(wire))

	env := []string{"LOKI_URL=" + loki.url, "GANTRY_CONTROLPLANE_URL=" + cp.URL, "GANTRY_LOG_LEVEL=error"}
	gw, err := startChild("gateway", env)
	if err != nil {
		return err
	}
	defer gw.stop()
	bare, err := startChild("bare", env)
	if err != nil {
		return err
	}
	defer bare.stop()

	// Warm both (connections, caches, pools) and check the gateway really stamps.
	if _, err := load(gw.url, token, w, conc, 300*time.Millisecond); err != nil {
		return err
	}
	if _, err := load(bare.url, token, w, conc, 300*time.Millisecond); err != nil {
		return err
	}
	if !loki.stamped.Load() {
		return fmt.Errorf("the gateway's batches reached Loki without node_id=%s", node)
	}

	var gwRates, bareRates []float64
	for r := 0; r < rounds; r++ {
		b, err := load(bare.url, token, w, conc, dur)
		if err != nil {
			return err
		}
		g, err := load(gw.url, token, w, conc, dur)
		if err != nil {
			return err
		}
		bareRates, gwRates = append(bareRates, b), append(gwRates, g)
		fmt.Printf("  round %d: bare %.1f MB/s, gateway %.1f MB/s\n", r+1, b, g)
	}
	g, b := median(gwRates), median(bareRates)
	fmt.Printf("\nforwarded throughput (decompressed log lines), median of %d:\n", rounds)
	fmt.Printf("  %-44s %8.1f MB/s\n", "bare decode-and-forward (baseline)", b)
	fmt.Printf("  %-44s %8.1f MB/s   goal >= 100 MB/s: %s\n", "gateway", g, verdict(g >= 100))
	fmt.Printf("  %-44s %8.2fx       goal <= 1.5x: %s\n", "gateway cost vs baseline (bare / gateway)", b/g, verdict(b/g <= 1.5))

	// Memory: fresh processes, so the peak is this phase's.
	gw.stop()
	bare.stop()
	fmt.Printf("\npeak RSS (VmHWM) with %d concurrent 1 MiB pushes for %s:\n", memConc, memDur)
	for _, role := range []string{"gateway", "bare"} {
		c, err := startChild(role, env)
		if err != nil {
			return err
		}
		before, _ := c.rss()
		rate, err := load(c.url, token, w, memConc, memDur)
		if err != nil {
			c.stop()
			return err
		}
		hwm, err := c.hwm()
		c.stop()
		if err != nil {
			return err
		}
		label := "gateway"
		goal := fmt.Sprintf("goal <= 64 MiB: %s", verdict(hwm <= 64<<20))
		if role == "bare" {
			label, goal = "bare decode-and-forward (no memory budget)", "(reference)"
		}
		fmt.Printf("  %-44s %8.1f MiB (idle %.1f MiB, %.1f MB/s)   %s\n", label, float64(hwm)/(1<<20), float64(before)/(1<<20), rate, goal)
	}
	fmt.Printf("\nfake Loki received %d pushes, %d rejected by the gateway (non-2xx)\n", loki.pushes.Load(), rejected.Load())
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

var rejected atomic.Int64

// load pushes batches from conc clients for d and returns MB/s of lines delivered.
func load(url, token string, w workload, conc int, d time.Duration) (float64, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, DisableCompression: true}}
	defer client.CloseIdleConnections()
	var bytes atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := c; time.Now().Before(deadline); i++ {
				k := i % len(w.bodies)
				status, err := post(client, url, token, w.bodies[k])
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if status/100 != 2 {
					rejected.Add(1)
					continue
				}
				bytes.Add(w.lineBytes[k])
			}
		}(c)
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(bytes.Load()) / 1e6 / time.Since(start).Seconds(), nil
}

func post(c *http.Client, url, token string, body []byte) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url+gateway.PushPath, bytesReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// fakeLoki accepts pushes; it decodes the first ones fully to check the stamp and then
// only reads bodies, so its cost is the same for both sides and small.
type fakeLoki struct {
	url     string
	srv     *http.Server
	pushes  atomic.Int64
	stamped atomic.Bool
}

func newFakeLoki(node uuid.UUID) *fakeLoki {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	l := &fakeLoki{url: "http://" + ln.Addr().String()}
	want := `node_id="` + node.String() + `"`
	l.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := l.pushes.Add(1)
		if n <= 64 && !l.stamped.Load() {
			if raw, err := snappy.Decode(nil, body); err == nil {
				var req push.PushRequest
				if req.Unmarshal(raw) == nil && len(req.Streams) > 0 && strings.Contains(req.Streams[0].Labels, want) {
					l.stamped.Store(true)
				}
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = l.srv.Serve(ln) }()
	return l
}

func (l *fakeLoki) close() { _ = l.srv.Close() }

// newFakeControlPlane answers the introspection the gateway makes, in the contract's
// shape, for the one bench node.
func newFakeControlPlane(node uuid.UUID, token string) *httpServer {
	path := "/api/v1/internal/nodes/" + node.String() + "/token/introspect"
	return newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != path || r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"code":"token_invalid","message":"no","correlation_id":"x"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"active": true, "node_id": node.String(), "node_name": "bench"})
	}))
}

type httpServer struct {
	URL string
	srv *http.Server
}

func newHTTPServer(h http.Handler) *httpServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	s := &httpServer{URL: "http://" + ln.Addr().String(), srv: &http.Server{Handler: h}}
	go func() { _ = s.srv.Serve(ln) }()
	return s
}

func (s *httpServer) Close() { _ = s.srv.Close() }

// child is a gateway or baseline process.
type child struct {
	cmd  *exec.Cmd
	url  string
	once sync.Once
}

func startChild(role string, env []string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(append(os.Environ(), env...), roleEnv+"="+role, "GANTRY_LOGGATEWAY_ADDR=127.0.0.1:0")
	cmd.Stderr = os.Stderr
	// The child's stdin is held open by this process: when it ends, however it ends,
	// the child sees EOF and stops.
	if _, err := cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%s child: %w", role, err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%s child said %q", role, line)
	}
	return &child{cmd: cmd, url: "http://" + addr}, nil
}

func (c *child) stop() {
	c.once.Do(func() {
		_ = c.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
	})
}

func (c *child) status(field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc status", field)
}

func (c *child) hwm() (int64, error) { return c.status("VmHWM") }
func (c *child) rss() (int64, error) { return c.status("VmRSS") }

// childGateway is the gateway as gantry-loggateway runs it (same config, same memory
// limit), on a port it reports on stdout.
func childGateway() error {
	cfg, err := gateway.ConfigFromEnv()
	if err != nil {
		return err
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(cfg.MemoryLimit())
	}
	g, err := gateway.New(cfg, gateway.Options{Introspector: gateway.NewControlPlane(cfg.ControlPlaneURL, cfg.IntrospectTimeout)})
	if err != nil {
		return err
	}
	defer func() { _ = g.Close() }()
	return serveChild(func(ctx context.Context, ln net.Listener) error { return g.Serve(ctx, ln) })
}

// childBare is the baseline: decode and forward, nothing else.
func childBare() error {
	lokiURL := os.Getenv("LOKI_URL") + gateway.PushPath
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		raw, err := snappy.Decode(nil, body)
		if err != nil {
			http.Error(w, "snappy", http.StatusBadRequest)
			return
		}
		var req push.PushRequest
		if err := req.Unmarshal(raw); err != nil {
			http.Error(w, "proto", http.StatusBadRequest)
			return
		}
		out, err := req.Marshal()
		if err != nil {
			http.Error(w, "marshal", http.StatusInternalServerError)
			return
		}
		fwd, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, lokiURL, bytes.NewReader(snappy.Encode(nil, out)))
		fwd.Header.Set("Content-Type", "application/x-protobuf")
		fwd.Header.Set("X-Scope-OrgID", "gantry")
		resp, err := client.Do(fwd)
		if err != nil {
			http.Error(w, "forward", http.StatusBadGateway)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	})
	srv := &http.Server{Handler: h}
	return serveChild(func(ctx context.Context, ln net.Listener) error {
		go func() { <-ctx.Done(); _ = srv.Close() }()
		if err := srv.Serve(ln); err != http.ErrServerClosed {
			return err
		}
		return nil
	})
}

func serveChild(serve func(context.Context, net.Listener) error) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", ln.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The parent signals, or dies (stdin closes): either way, stop.
		sig := make(chan os.Signal, 1)
		notify(sig)
		<-sig
		cancel()
	}()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	return serve(ctx, ln)
}

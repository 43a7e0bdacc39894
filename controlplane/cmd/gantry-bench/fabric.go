package main

// The node fabric benchmarks (docs/fabric.md), all on loopback in the same run:
//
//   - single-stream throughput over the tunnel (TLS+yamux, QUIC) vs direct TLS over TCP;
//   - 16 concurrent streams on one tunnel vs 16 direct TLS connections;
//   - stream-open rate (open, 1-byte round trip, close) vs a new TLS connection each;
//   - handshakes per second (fabricnet.Dial) vs bare TLS handshakes;
//   - agent capacity: N simulated agents (a child process) against one fabric server:
//     time to connect all, control-plane memory per agent, time for all to reconnect
//     after the fabric server restarts gracefully, and after it is killed with SIGKILL
//     (the server then runs in a child process of its own) and started again.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/quic-go/quic-go"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabrictest"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

type fabricOpts struct {
	agents    int
	transport fabricnet.Mode
	dur       time.Duration
	rounds    int
	// spread is the simulated agents' ReconnectSpread (fabrictest.Agent); zero
	// reconnects like the real agent, 250-500 ms after a tunnel ends.
	spread time.Duration
}

func runFabric(ctx context.Context, fx *fixture, o fabricOpts) error {
	pki, err := fabric.LoadPKI(ctx, fx.pool, fx.app.Config.Auth.MasterKey.Derive("gantry/fabric-pki"),
		[]string{"localhost", "127.0.0.1"}, fx.app.Clock, fx.app.IDs)
	if err != nil {
		return err
	}
	serverTLS := &tls.Config{Certificates: []tls.Certificate{pki.Server}}
	serverTLS.SetSessionTicketKeys([][32]byte{pki.TicketKey}) // as fabric.New does
	clientTLS := &tls.Config{RootCAs: pki.CertPool(), ServerName: "127.0.0.1"}

	fmt.Printf("\nnode fabric (loopback, %d rounds x %s):\n", o.rounds, o.dur)
	ln, err := fabricnet.Listen("127.0.0.1:0", serverTLS, nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	go acceptSink(ln)
	direct, err := tls.Listen("tcp", "127.0.0.1:0", withALPN(serverTLS))
	if err != nil {
		return err
	}
	defer direct.Close()
	go directSink(direct)
	addr, daddr := ln.Addr().String(), direct.Addr().String()

	sessions := map[fabricnet.Mode]fabricnet.Session{}
	for _, m := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		s, err := fabricnet.Dial(ctx, addr, m, clientTLS, nil)
		if err != nil {
			return fmt.Errorf("dial %s: %w", m, err)
		}
		defer s.Close("bench done")
		sessions[m] = s
	}
	dialDirect := func() (net.Conn, error) { return tls.Dial("tcp", daddr, withALPN(clientTLS)) }

	// Each round measures the direct baseline and both transports back to back, and the
	// ratio is taken within the round: on a small shared machine the absolute rates drift
	// from round to round, the ratio of neighbours much less. The median round is
	// reported, with the range of the ratios.
	for _, streams := range []int{1, 16} {
		rates := map[fabricnet.Mode][]float64{}
		ratios := map[fabricnet.Mode][]float64{}
		var bases []float64
		for range o.rounds {
			base := sendLoad(o.dur, streams, dialDirect)
			bases = append(bases, base)
			for _, m := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
				s := sessions[m]
				v := sendLoad(o.dur, streams, func() (net.Conn, error) { return s.OpenStream(ctx) })
				rates[m] = append(rates[m], v)
				ratios[m] = append(ratios[m], v/base)
			}
		}
		for _, m := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
			goal := 0.8
			if m == fabricnet.ModeQUIC {
				goal = 0.5
			}
			what := "single-stream throughput"
			goalText := fmt.Sprintf("goal >= %.1fx: %s", goal, verdict(median(ratios[m]) >= goal))
			if streams > 1 {
				what = fmt.Sprintf("%d concurrent streams, total throughput", streams)
				goalText = fmt.Sprintf("vs %d direct connections; no goal", streams)
			}
			fmt.Printf("  %-44s %-5s %8.0f MiB/s vs direct TLS/TCP %8.0f MiB/s = %.2fx (rounds %.2f-%.2fx; %s)\n",
				what, m, median(rates[m])/(1<<20), median(bases)/(1<<20), median(ratios[m]),
				slices.Min(ratios[m]), slices.Max(ratios[m]), goalText)
		}
	}

	base := median(repeat(o.rounds, func() float64 { return pingRate(o.dur, 4, dialDirect) }))
	for _, m := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		s := sessions[m]
		v := median(repeat(o.rounds, func() float64 {
			return pingRate(o.dur, 4, func() (net.Conn, error) { return s.OpenStream(ctx) })
		}))
		fmt.Printf("  %-44s %-5s %8.0f /s    vs new TLS connection each %6.0f /s    = %.2fx\n",
			"stream open + 1-byte round trip + close", m, v, base, v/base)
	}

	hsBase := median(repeat(o.rounds, func() float64 {
		return throughputN(o.dur, 4, func() error {
			c, err := dialDirect()
			if err == nil {
				err = c.(*tls.Conn).Handshake()
				_ = c.Close()
			}
			return err
		})
	}))
	// A reconnecting agent resumes its TLS session (fabric.PKI.TicketKey): the same
	// handshakes with a session cache, against full ones, in the same rounds.
	resuming := clientTLS.Clone()
	resuming.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	for _, m := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		for _, c := range []struct {
			what string
			tls  *tls.Config
		}{{"tunnel handshakes", clientTLS}, {"tunnel handshakes, TLS session resumed", resuming}} {
			cpu0 := procCPU(os.Getpid())
			var done float64
			v := median(repeat(o.rounds, func() float64 {
				r := throughputN(o.dur, 4, func() error {
					s, err := fabricnet.Dial(ctx, addr, m, c.tls, nil)
					if err == nil {
						_ = s.Close("bench")
					}
					return err
				})
				done += r * o.dur.Seconds()
				return r
			}))
			per := (procCPU(os.Getpid()) - cpu0) / time.Duration(max(done, 1))
			fmt.Printf("  %-44s %-5s %8.0f /s    vs bare TLS/TCP handshakes %6.0f /s    = %.2fx; CPU %.0f us per handshake (both ends)\n",
				c.what, m, v, hsBase, v/hsBase, float64(per)/float64(time.Microsecond))
		}
	}

	return agentCapacity(ctx, fx, o)
}

func withALPN(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.NextProtos = []string{fabricnet.ALPN}
	return c
}

// acceptSink serves every stream of every tunnel: a stream whose first byte is 'p' is a
// ping (answer one byte, then close); anything else is read to the end.
func acceptSink(ln *fabricnet.Listener) {
	for {
		s, err := ln.Accept(context.Background())
		if err != nil {
			return
		}
		go func() {
			for {
				st, err := s.AcceptStream(context.Background())
				if err != nil {
					return
				}
				go sink(st)
			}
		}()
	}
}

func directSink(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go sink(c)
	}
}

func sink(c net.Conn) {
	defer c.Close()
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return
	}
	if b[0] == 'p' {
		_, _ = c.Write(b[:])
		_, _ = io.Copy(io.Discard, c)
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

// sendLoad writes from n streams for dur and returns bytes per second.
func sendLoad(dur time.Duration, n int, open func() (net.Conn, error)) float64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(dur)
	buf := make([]byte, 64<<10)
	buf[0] = 'd'
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := open()
			if err != nil {
				return
			}
			defer c.Close()
			for time.Now().Before(deadline) {
				k, err := c.Write(buf)
				total.Add(int64(k))
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(total.Load()) / dur.Seconds()
}

// pingRate opens a stream/connection, does a 1-byte round trip and closes it, from conc
// workers; it returns completions per second.
func pingRate(dur time.Duration, conc int, open func() (net.Conn, error)) float64 {
	return throughputN(dur, conc, func() error {
		c, err := open()
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte{'p'}); err != nil {
			return err
		}
		var b [1]byte
		_, err = io.ReadFull(c, b[:])
		return err
	})
}

func throughputN(dur time.Duration, conc int, op func() error) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(dur)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if op() == nil {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / dur.Seconds()
}

// ---------------------------------------------------------------------------------------
// Agent capacity

// benchDirectory authenticates "bench-<i>" tokens; node records are not the subject here.
type benchDirectory struct {
	ids                        []uuid.UUID
	online, offline, inventory atomic.Int64
}

func (d *benchDirectory) AuthenticateNode(_ context.Context, token string) (uuid.UUID, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(token, "bench-"))
	if err != nil || i < 0 || i >= len(d.ids) {
		return uuid.Nil, fleet.ErrUnauthenticated
	}
	return d.ids[i], nil
}
func (d *benchDirectory) NodeConnected(context.Context, uuid.UUID, fleet.Inventory, time.Time) error {
	d.inventory.Add(1)
	return nil
}
func (d *benchDirectory) NodeStatus(_ context.Context, _ uuid.UUID, online bool, _ time.Time) error {
	if online {
		d.online.Add(1)
	} else {
		d.offline.Add(1)
	}
	return nil
}
func (d *benchDirectory) NodeTelemetry(context.Context, uuid.UUID, []fleet.GPUMetrics) error {
	return nil
}

// newBenchDirectory knows n nodes whose ids follow from their index, so a fabric server
// in another process (the SIGKILL run) authenticates the same agents as the same nodes.
func newBenchDirectory(n int) *benchDirectory {
	dir := &benchDirectory{ids: make([]uuid.UUID, n)}
	for i := range dir.ids {
		dir.ids[i] = uuid.NewSHA1(uuid.NameSpaceOID, []byte("gantry-bench-node-"+strconv.Itoa(i)))
	}
	return dir
}

// capacityConfig is the fabric server's configuration in the capacity runs, in this
// process and in the server child alike.
func capacityConfig(fx *fixture) fabric.Config {
	return fabric.Config{
		Addr: "127.0.0.1:0", ReplicaID: "bench", Bucket: fx.app.Config.EventsStream + "_FABRIC_CAP",
		SubjectPrefix: strings.TrimSuffix(fx.app.Config.EventsSubjectPrefix, "events.") + "fabriccap.",
		// Heartbeats flow during the run: fleet-scaled to at most 1000/s, at least every 5s.
		MinHeartbeatInterval: 5 * time.Second, MaxHeartbeatsPerSecond: 1000, StartupTTL: 2 * time.Minute,
		MaxConcurrentQUICHandshakes: quicHandshakeBound(),
	}
}

// quicHandshakeBound is $GANTRY_BENCH_FABRIC_QUIC_HANDSHAKES: the fabric server's bound
// of QUIC handshakes in progress (unset or 0: unbounded, the default; e.g. 64), for
// comparing the two in the same build.
func quicHandshakeBound() int {
	n, _ := strconv.Atoi(os.Getenv("GANTRY_BENCH_FABRIC_QUIC_HANDSHAKES"))
	return n
}

func agentCapacity(ctx context.Context, fx *fixture, o fabricOpts) error {
	n := o.agents
	dir := newBenchDirectory(n)
	cfg := capacityConfig(fx)
	defer func() { _ = fx.app.JS.DeleteKeyValue(context.Background(), cfg.Bucket) }()
	deps := fabric.Deps{
		Pool: fx.pool, SealKey: fx.app.Config.Auth.MasterKey.Derive("gantry/fabric-pki"), NATS: fx.app.NATS, JS: fx.app.JS,
		Directory: dir, Clock: fx.app.Clock, IDs: fx.app.IDs, Log: slog.New(slog.DiscardHandler),
	}
	start := func(addr string) (*fabric.Server, func(), error) {
		c := cfg
		c.Addr = addr
		var srv *fabric.Server
		var err error
		for range 50 { // the port was just freed: retry a moment on a conflict
			if srv, err = fabric.New(ctx, c, deps); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return nil, nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Run(rctx) }()
		return srv, func() { cancel(); <-done }, nil
	}
	runtime.GC()
	before := liveBytes()
	srv, stop, err := start(cfg.Addr)
	if err != nil {
		return err
	}
	addr := srv.ListenAddr().String()
	caFile, err := os.CreateTemp("", "gantry-bench-ca-*.pem")
	if err != nil {
		return err
	}
	defer os.Remove(caFile.Name())
	_, _ = caFile.Write(srv.CAPEM())
	_ = caFile.Close()

	child := exec.CommandContext(ctx, os.Args[0], "-fabric-child")
	child.Env = append(os.Environ(), "BENCH_FABRIC_ADDR="+addr, "BENCH_FABRIC_CA="+caFile.Name(),
		"BENCH_FABRIC_AGENTS="+strconv.Itoa(n), "BENCH_FABRIC_MODE="+string(o.transport),
		"BENCH_FABRIC_SPREAD="+o.spread.String())
	child.Stderr = os.Stderr
	stdin, _ := child.StdinPipe()
	stdout, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := child.Start(); err != nil {
		return err
	}
	defer func() { _ = stdin.Close(); _ = child.Wait() }()
	agents := &agentsChild{in: stdin, out: bufio.NewScanner(stdout)}
	agentsPID = child.Process.Pid
	connected := waitSessions(srv, n, 5*time.Minute)
	tConnect := time.Since(t0)
	hb0 := dir.online.Load()
	time.Sleep(6 * time.Second) // at least one heartbeat interval
	runtime.GC()
	after := liveBytes()
	// Signed: with a handful of agents the heap can end below where it started.
	per := (float64(after) - float64(before)) / float64(max(connected, 1))
	bound := "unbounded"
	if b := quicHandshakeBound(); b > 0 {
		bound = strconv.Itoa(b)
	}
	resumption := "on"
	if os.Getenv("GANTRY_BENCH_FABRIC_NO_RESUMPTION") == "1" {
		resumption = "off (GANTRY_BENCH_FABRIC_NO_RESUMPTION=1)"
	}
	fmt.Printf("  agent capacity (%s, %d simulated agents in a child process, GOMAXPROCS=%d, QUIC handshakes in progress %s, TLS session resumption %s, control plane GC percent %d):\n", o.transport, n, runtime.GOMAXPROCS(0), bound, resumption, gcPercent)
	fmt.Printf("    connected %d/%d in %.1fs; control-plane memory %.1f KiB per agent (heap+stacks, goal <= 100 KiB)\n",
		connected, n, tConnect.Seconds(), per/1024)
	fmt.Printf("    directory calls while connected: online %d, offline %d (heartbeats write nothing)\n", hb0, dir.offline.Load())

	t1 := time.Now()
	if path := os.Getenv("GANTRY_BENCH_STOP_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			_ = pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
		}
	}
	cpu0 := sampleCPU(os.Getpid())
	agentsProfile := os.Getenv("GANTRY_BENCH_AGENTS_CPUPROFILE")
	if agentsProfile != "" {
		_, _ = fmt.Fprintf(stdin, "cpuprofile %s\n", agentsProfile)
	}
	dumpSlowStop(os.Getenv("GANTRY_BENCH_STOP_DUMP"), 5*time.Second, stop)
	tStop := time.Since(t1)
	srv2, stop2, err := start(addr)
	if err != nil {
		return err
	}
	defer stop2()
	tUp := time.Since(t1)
	var tAccepting atomic.Int64
	go func() {
		if srv2.WaitPresence(ctx) == nil {
			tAccepting.Store(int64(time.Since(t1)))
		}
	}()
	re := waitSessions(srv2, n, 3*time.Minute)
	fmt.Printf("    after a graceful fabric server restart: %d/%d reconnected in %.1fs (goal: all within 30s; stop took %.1fs, serving again after %.1fs); offline marks %d\n",
		re, n, time.Since(t1).Seconds(), tStop.Seconds(), tUp.Seconds(), dir.offline.Load())
	fmt.Println(cpu0.report(sampleCPU(os.Getpid()), re, n))
	if agentsProfile != "" {
		_, _ = fmt.Fprintln(stdin, "cpuprofile stop")
	}
	fmt.Printf("      the new server's presence mirror was ready (it accepts from then) %.1fs after the stop began; QUIC attempts refused as busy %d\n",
		time.Duration(tAccepting.Load()).Seconds(), srv2.QUICRefused())
	agents.report(t1)
	stop2()
	if err := killedRestart(ctx, fx, o, addr); err != nil {
		return err
	}
	agents.report(tKill)
	return nil
}

// tKill is when killedRestart killed the server child (for the agents' report).
var tKill time.Time

// agentsPID is the simulated agents' process, whose CPU the reconnect runs count.
var agentsPID int

// cpuSample is the CPU used so far by the fabric server's process, the agents' process
// and the whole machine (every process, other engineers' included), from /proc.
type cpuSample struct {
	at                   time.Time
	server, agents, busy time.Duration
	cores                int
}

// sampleCPU reads the CPU counters; serverPID -1 means a server that has not started.
func sampleCPU(serverPID int) cpuSample {
	c := cpuSample{at: time.Now(), agents: procCPU(agentsPID), busy: machineBusy(), cores: runtime.NumCPU()}
	if serverPID > 0 {
		c.server = procCPU(serverPID)
	}
	return c
}

// report prints the CPU one reconnect cost (server and agent sides together, from their
// processes' counters) and the bound it implies: the fleet cannot come back faster than
// its reconnects' CPU divided by the machine's cores, whatever the backoff does.
func (c cpuSample) report(end cpuSample, back, fleet int) string {
	server, agents := end.server-c.server, end.agents-c.agents
	wall := end.at.Sub(c.at)
	busy := end.busy - c.busy
	per := (server + agents) / time.Duration(max(back, 1))
	bound := time.Duration(float64(per) * float64(fleet) / float64(c.cores))
	return fmt.Sprintf("      CPU in the reconnect (%.1fs): fabric server %.1fs, agents %.1fs = %.2f ms per reconnect (server %.2f, agent %.2f); "+
		"machine busy %.1f of %.1f core-seconds (others' work included); %d reconnects need >= %.1fs on %d cores at that cost",
		wall.Seconds(), server.Seconds(), agents.Seconds(), ms(per), ms(server/time.Duration(max(back, 1))), ms(agents/time.Duration(max(back, 1))),
		busy.Seconds(), wall.Seconds()*float64(c.cores), fleet, bound.Seconds(), c.cores)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// agentsChild talks to the simulated agents' process: "report <unix ns>" asks it how
// its agents' tunnels ended since then and how soon they were back; it answers with
// lines to print, then "end".
type agentsChild struct {
	in  io.Writer
	out *bufio.Scanner
}

func (c *agentsChild) report(since time.Time) {
	if _, err := fmt.Fprintf(c.in, "report %d\n", since.UnixNano()); err != nil {
		return
	}
	for c.out.Scan() && c.out.Text() != "end" {
		fmt.Println(c.out.Text())
	}
}

// killedRestart measures the reconnect after a crash: the fabric server moves to a child
// process (the agents reconnect to it), which is killed with SIGKILL and started again
// on the same address; the time runs from the kill until every agent is back. On QUIC
// only the stateless reset (its key derived from the fabric CA) ends the agents' old
// tunnels before their idle timeout (45 s); on TCP the kernel closes them.
func killedRestart(ctx context.Context, fx *fixture, o fabricOpts, addr string) error {
	url := fx.pool.Config().ConnString()
	env := append(os.Environ(), "BENCH_FABRIC_ADDR="+addr, "BENCH_FABRIC_AGENTS="+strconv.Itoa(o.agents),
		"BENCH_FABRIC_DATABASE_URL="+url, "BENCH_FABRIC_NATS_URL="+fx.app.Config.NATSURL,
		"BENCH_FABRIC_SEAL_KEY="+hex.EncodeToString(fx.app.Config.Auth.MasterKey.Derive("gantry/fabric-pki")),
		"BENCH_FABRIC_BUCKET="+capacityConfig(fx).Bucket, "BENCH_FABRIC_SUBJECTS="+capacityConfig(fx).SubjectPrefix)
	first, err := startServerChild(ctx, env, o.agents)
	if err != nil {
		return err
	}
	defer first.kill()
	// Every agent moves over first; on a machine too loaded for all of them within the
	// limit, the kill is measured against those that did (and says so).
	target := o.agents
	if _, err := first.waitAll(target, 5*time.Minute); err != nil {
		target = first.online
		fmt.Printf("    (only %d/%d agents on the server child before the kill: %v)\n", target, o.agents, err)
	}
	t0 := time.Now()
	tKill = t0
	first.kill()
	cpu0 := sampleCPU(-1)
	second, err := startServerChild(ctx, env, o.agents)
	if err != nil {
		return err
	}
	defer second.kill()
	second.since = t0
	tUp := time.Since(t0)
	offline, err := second.waitAll(target, 3*time.Minute)
	back := target
	if err != nil {
		back = second.online
	}
	// The second server's whole life is its CPU in the reconnect (it started at 0).
	cpu1 := sampleCPU(second.cmd.Process.Pid)
	fmt.Printf("    after SIGKILL of the fabric server and a restart: %d/%d reconnected in %.1fs (goal: all within 30s; serving again after %.1fs); offline marks %d\n",
		back, target, time.Since(t0).Seconds(), tUp.Seconds(), offline)
	fmt.Println(cpu0.report(cpu1, back, o.agents))
	fmt.Printf("      back after the kill: %s; peak %s; QUIC attempts refused as busy %d\n", second.progress(target), second.peakRate(), second.refused)
	return nil
}

// serverChild is a fabric server in a child process (gantry-bench -fabric-server-child).
type serverChild struct {
	cmd    *exec.Cmd
	lines  chan string
	agents int // the agents there are
	online int // sessions on the child at its last report
	// refused is how many QUIC attempts the child refused as busy (reported with "all").
	refused int64
	// since and seen: when set, the time from since at which the session count first
	// reached each count reported (the reconnect's progress).
	since time.Time
	seen  []progressMark
}

type progressMark struct {
	online int
	at     time.Duration
}

// progress says when 10, 50, 90, 99 and 100 per cent of target were back.
func (c *serverChild) progress(target int) string {
	var out []string
	for _, pct := range []int{10, 50, 90, 99, 100} {
		want := (target*pct + 99) / 100
		for _, m := range c.seen {
			if m.online >= want {
				out = append(out, fmt.Sprintf("%d%% %.1fs", pct, m.at.Seconds()))
				break
			}
		}
	}
	return strings.Join(out, ", ")
}

// peakRate is the most sessions the child gained within one second of the reconnect
// (its accept rate at the height of the storm).
func (c *serverChild) peakRate() string {
	best := 0
	for i, m := range c.seen {
		j := i
		for j > 0 && m.at-c.seen[j-1].at <= time.Second {
			j--
		}
		base := 0
		if j > 0 {
			base = c.seen[j-1].online
		}
		best = max(best, m.online-base)
	}
	return fmt.Sprintf("%d sessions/s", best)
}

// startServerChild starts the child and waits until it serves.
func startServerChild(ctx context.Context, env []string, agents int) (*serverChild, error) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-fabric-server-child")
	cmd.Env = env
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &serverChild{cmd: cmd, lines: make(chan string, 1024), agents: agents}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	select {
	case l, ok := <-c.lines:
		if ok && l == "serving" {
			return c, nil
		}
		c.kill()
		return nil, fmt.Errorf("fabric server child: %q", l)
	case <-time.After(2 * time.Minute):
		c.kill()
		return nil, errors.New("fabric server child did not start")
	}
}

// waitAll waits for the child's report that target agents are online through it (all
// of them: their Hellos processed; fewer: their sessions), and returns the offline marks
// it counted.
func (c *serverChild) waitAll(target int, limit time.Duration) (int64, error) {
	deadline := time.After(limit)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return 0, errors.New("fabric server child exited")
			}
			var k int
			var offline int64
			if _, err := fmt.Sscanf(l, "refused %d", &c.refused); err == nil {
				continue
			}
			if _, err := fmt.Sscanf(l, "all %d offline %d", &k, &offline); err == nil {
				c.online = k
				c.mark(k)
				return offline, nil
			}
			if _, err := fmt.Sscanf(l, "online %d offline %d", &k, &offline); err == nil {
				c.online = k
				c.mark(k)
				if k >= target && target < c.agents {
					return offline, nil
				}
			}
		case <-deadline:
			return 0, fmt.Errorf("%d agents back after %s", c.online, limit)
		}
	}
}

func (c *serverChild) mark(online int) {
	if !c.since.IsZero() {
		c.seen = append(c.seen, progressMark{online, time.Since(c.since)})
	}
}

// kill ends the child with SIGKILL (its sockets closed by the kernel, nobody told).
func (c *serverChild) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// fabricServerChild runs a fabric server with the capacity run's configuration on
// $BENCH_FABRIC_ADDR until it is killed. It prints "serving" once it accepts, then
// "online <sessions> offline <marks>" whenever its session count changed (checked every
// 100 ms) and "all <n> offline <marks>" once all $BENCH_FABRIC_AGENTS agents are online
// through it.
func fabricServerChild() error {
	ctx := context.Background()
	n, _ := strconv.Atoi(os.Getenv("BENCH_FABRIC_AGENTS"))
	seal, err := hex.DecodeString(os.Getenv("BENCH_FABRIC_SEAL_KEY"))
	if err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(os.Getenv("BENCH_FABRIC_DATABASE_URL"))
	if err != nil {
		return err
	}
	db.ConfigurePool(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(os.Getenv("BENCH_FABRIC_NATS_URL"))
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	dir := newBenchDirectory(n)
	cfg := fabric.Config{
		Addr: os.Getenv("BENCH_FABRIC_ADDR"), ReplicaID: "bench", Bucket: os.Getenv("BENCH_FABRIC_BUCKET"),
		SubjectPrefix:        os.Getenv("BENCH_FABRIC_SUBJECTS"),
		MinHeartbeatInterval: 5 * time.Second, MaxHeartbeatsPerSecond: 1000, StartupTTL: 2 * time.Minute,
		MaxConcurrentQUICHandshakes: quicHandshakeBound(),
	}
	deps := fabric.Deps{Pool: pool, SealKey: seal, NATS: nc, JS: js, Directory: dir, Log: slog.New(slog.DiscardHandler)}
	var srv *fabric.Server
	for range 50 { // the port was just freed: retry a moment on a conflict
		if srv, err = fabric.New(ctx, cfg, deps); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	go func() { _ = srv.Run(ctx) }()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_ = srv.WaitPresence(wctx)
	cancel()
	fmt.Println("serving")
	last := -1
	for {
		k := srv.LocalSessions()
		if k >= n && onlineHere(srv) >= n {
			fmt.Printf("refused %d\n", srv.QUICRefused())
			fmt.Printf("all %d offline %d\n", n, dir.offline.Load())
			select {} // until killed
		}
		if k != last {
			fmt.Printf("online %d offline %d\n", k, dir.offline.Load())
			last = k
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func liveBytes() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// onlineHere counts the nodes presence has online through srv's replica.
func onlineHere(srv *fabric.Server) int {
	all, _ := srv.AllPresence(context.Background())
	online := 0
	for _, p := range all {
		if p.Online && p.Replica == srv.ReplicaID() {
			online++
		}
	}
	return online
}

func waitSessions(srv *fabric.Server, n int, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		// Sessions count from auth; wait for the hellos too.
		if srv.LocalSessions() >= n && onlineHere(srv) >= n {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
	return srv.LocalSessions()
}

// fabricChild runs the simulated agents (gantry-bench -fabric-child) until stdin closes,
// answering the parent's "report" requests (agentsChild) on stdout.
func fabricChild() error {
	n, _ := strconv.Atoi(os.Getenv("BENCH_FABRIC_AGENTS"))
	ca, err := os.ReadFile(os.Getenv("BENCH_FABRIC_CA"))
	if err != nil {
		return err
	}
	mode, err := fabricnet.ParseMode(os.Getenv("BENCH_FABRIC_MODE"))
	if err != nil {
		return err
	}
	spread, _ := time.ParseDuration(os.Getenv("BENCH_FABRIC_SPREAD"))
	noResumption := os.Getenv("GANTRY_BENCH_FABRIC_NO_RESUMPTION") == "1"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := newTunnelLog(n)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var since int64
			var path string
			if _, err := fmt.Sscanf(sc.Text(), "cpuprofile %s", &path); err == nil {
				// The agents' side of a reconnect (GANTRY_BENCH_AGENTS_CPUPROFILE).
				if path == "stop" {
					pprof.StopCPUProfile()
				} else if f, err := os.Create(path); err == nil {
					_ = pprof.StartCPUProfile(f)
				}
				continue
			}
			if _, err := fmt.Sscanf(sc.Text(), "report %d", &since); err == nil {
				fmt.Print(log.report(time.Unix(0, since)))
				fmt.Println("end")
			}
		}
		cancel()
	}()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // bound concurrent first dials
	for i := range n {
		a := fabrictest.NewAgent(os.Getenv("BENCH_FABRIC_ADDR"), "bench-"+strconv.Itoa(i), ca, mode)
		// After an established tunnel ends: 100-200 ms, unless the spread applies (the
		// real agent: 250-500 ms). A failed dial backs off up to 5 s (the real agent: up
		// to 30 s), as in the runs docs/fabric.md compares with.
		a.BackoffMin, a.BackoffMax = 200*time.Millisecond, 5*time.Second
		a.ReconnectSpread = spread
		a.OnRetry = func(established bool, _, err error, d time.Duration) { log.retry(i, established, err, d) }
		a.Sessions = make(chan fabrictest.Connection, 1)
		a.NoResumption = noResumption
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			go func() {
				first := time.After(30 * time.Second)
				release := func() {
					if first != nil {
						first = nil
						<-sem
					}
				}
				for {
					select {
					case c, ok := <-a.Sessions:
						release()
						if !ok {
							return
						}
						log.up(i, c.Session.TLS().DidResume)
						<-c.Session.Done()
						log.down(i, c.Session.Err())
					case <-first:
						release()
					}
				}
			}()
			if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				fmt.Fprintln(os.Stderr, "agent:", err)
			}
			close(a.Sessions)
		}()
	}
	wg.Wait()
	return nil
}

// tunnelLog records, per simulated agent, when its tunnels came up (Welcome) and when
// and why they ended.
type tunnelLog struct {
	mu     sync.Mutex
	events [][]tunnelEvent
	// spreadWait is each agent's last wait after an established tunnel ended.
	spreadWait []time.Duration
}

type tunnelEvent struct {
	at time.Time
	up bool
	// resumed: the tunnel that came up resumed a TLS session (no certificate chain).
	resumed bool
	cause   string // for an end; for a retry, why the attempt failed
	// retry marks a failed attempt (no Welcome) and wait the backoff chosen after it.
	retry bool
	wait  time.Duration
}

// retry records a failed attempt (one that reached no Welcome) and the wait after it.
func (l *tunnelLog) retry(i int, established bool, err error, wait time.Duration) {
	l.mu.Lock()
	if established {
		// The wait after an established tunnel (the spread, or Delay(0)) joins the record
		// of its end, which down may not have written yet.
		l.spreadWait[i] = wait
		l.mu.Unlock()
		return
	}
	l.events[i] = append(l.events[i], tunnelEvent{at: time.Now(), retry: true, cause: attemptCause(err), wait: wait})
	l.mu.Unlock()
}

// attemptCause names why an attempt failed, in classes worth counting.
func attemptCause(err error) string {
	var te *quic.TransportError
	var hs *quic.HandshakeTimeoutError
	var idle *quic.IdleTimeoutError
	var app *quic.ApplicationError
	switch {
	case errors.As(err, &te) && te.ErrorCode == quic.ConnectionRefused:
		return "CONNECTION_REFUSED"
	case errors.As(err, &hs):
		return "handshake timeout"
	case errors.As(err, &idle):
		return "idle timeout"
	case errors.As(err, &app) && app.Remote:
		return "closed by the server"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, fabricnet.ErrTokenRefused):
		return "token refused"
	case err == nil:
		return "none"
	}
	msg := err.Error()
	if len(msg) > 48 {
		msg = msg[:48]
	}
	return msg
}

func newTunnelLog(n int) *tunnelLog {
	return &tunnelLog{events: make([][]tunnelEvent, n), spreadWait: make([]time.Duration, n)}
}

func (l *tunnelLog) up(i int, resumed bool) {
	l.mu.Lock()
	l.events[i] = append(l.events[i], tunnelEvent{at: time.Now(), up: true, resumed: resumed})
	l.mu.Unlock()
}

func (l *tunnelLog) down(i int, err error) {
	cause := "other"
	var reset *quic.StatelessResetError
	var idle *quic.IdleTimeoutError
	var app *quic.ApplicationError
	switch {
	case errors.As(err, &reset):
		cause = "stateless reset"
	case errors.As(err, &idle):
		cause = "idle timeout"
	case errors.As(err, &app) && app.Remote:
		cause = "closed by the server"
	case errors.As(err, &app):
		cause = "closed by the agent"
	case errors.Is(err, fabricnet.ErrSessionClosed):
		cause = "connection closed" // TLS+yamux keeps no reason
	}
	l.mu.Lock()
	l.events[i] = append(l.events[i], tunnelEvent{at: time.Now(), cause: cause})
	l.mu.Unlock()
}

// report says, for the tunnels that ended after since, how long after since they
// ended and why, and how long their agents took from there to their next Welcome.
func (l *tunnelLog) report(since time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ended, back, waits []time.Duration
	causes := map[string]int{}
	failed := map[string]int{}
	var attempts [6]int // failed attempts before the next Welcome: 0..4, 5 or more
	var maxWait time.Duration
	var lastAttempt, spreads []time.Duration
	resumed := 0
	for i, evs := range l.events {
		for k, e := range evs {
			if e.up || e.retry || e.at.Before(since) {
				continue
			}
			ended = append(ended, e.at.Sub(since))
			causes[e.cause]++
			n, waited, prev, lastWait := 0, time.Duration(0), time.Time{}, time.Duration(0)
			for _, u := range evs[k+1:] {
				if u.up {
					back = append(back, u.at.Sub(e.at))
					if u.resumed {
						resumed++
					}
					// The successful attempt: from the end of the wait before it (after
					// the last failure, or after the tunnel's end) to the Welcome.
					last := u.at.Sub(e.at) - l.spreadWait[i]
					if n > 0 {
						last = u.at.Sub(prev) - lastWait
					}
					lastAttempt = append(lastAttempt, last)
					spreads = append(spreads, l.spreadWait[i])
					break
				}
				if u.retry {
					prev, lastWait = u.at, u.wait
					n++
					waited += u.wait
					maxWait = max(maxWait, u.wait)
					failed[u.cause]++
				}
			}
			attempts[min(n, len(attempts)-1)]++
			waits = append(waits, waited)
			break // the first end after since only
		}
	}
	var by []string
	for c, k := range causes {
		by = append(by, fmt.Sprintf("%s %d", c, k))
	}
	slices.Sort(by)
	var fails []string
	for c, k := range failed {
		fails = append(fails, fmt.Sprintf("%s %d", c, k))
	}
	slices.Sort(fails)
	hist := make([]string, len(attempts))
	for k, c := range attempts {
		hist[k] = fmt.Sprintf("%d: %d", k, c)
	}
	hist[len(hist)-1] = fmt.Sprintf("%d+: %d", len(hist)-1, attempts[len(hist)-1])
	return fmt.Sprintf("      agents' view: %d tunnels ended (%s) after %s; from the end to the next Welcome %s; %d of the %d next tunnels resumed their TLS session\n"+
		"      failed attempts before the next Welcome (agents by count) %s; failures: %s; backoff waited after failures %s (longest single wait %.1fs)\n"+
		"      wait after the end (spread) %s; the successful attempt itself (dial to Welcome) %s\n",
		len(ended), strings.Join(by, ", "), percentiles(ended), percentiles(back), resumed, len(back),
		strings.Join(hist, ", "), strings.Join(fails, ", "), percentiles(waits), maxWait.Seconds(),
		percentiles(spreads), percentiles(lastAttempt))
}

// percentiles prints the 50th, 90th, 99th percentile and the maximum of ds.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	slices.Sort(ds)
	at := func(p int) float64 { return ds[min(len(ds)-1, len(ds)*p/100)].Seconds() }
	return fmt.Sprintf("p50 %.1fs, p90 %.1fs, p99 %.1fs, max %.1fs", at(50), at(90), at(99), ds[len(ds)-1].Seconds())
}

// dumpSlowStop runs stop; when path is set and stop takes longer than after, it writes
// the aggregated goroutine profile to path once (to see what a slow shutdown waits on).
func dumpSlowStop(path string, after time.Duration, stop func()) {
	if path == "" {
		stop()
		return
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(after):
			if f, err := os.Create(path); err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 1)
				_ = f.Close()
			}
		}
	}()
	stop()
	close(done)
}

package terminal_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/controlplane/internal/app"
	"github.com/gantry-gpu/gantry/controlplane/internal/terminal"
	nodeterm "github.com/gantry-gpu/gantry/nodeagent/terminal"
	"github.com/gantry-gpu/gantry/proto/api"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/gantry-gpu/gantry/shared/termproto"
)

// benchWorld is newWorld with GANTRY_BENCH_TERMINAL_WINDOW, when set, as the terminal's
// output window (bytes; -1 for the terminal's flow control off), to compare settings
// with the same benchmark.
func benchWorld(b *testing.B) *world {
	v := os.Getenv("GANTRY_BENCH_TERMINAL_WINDOW")
	if v == "" {
		return newWorld(b)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		b.Fatalf("GANTRY_BENCH_TERMINAL_WINDOW: %v", err)
	}
	return newWorld(b, apitest.WithConfig(func(c *app.Config) { c.Terminal.OutputWindow = n }))
}

func reportRTT(b *testing.B, rtts []time.Duration) {
	if len(rtts) == 0 {
		return
	}
	slices.Sort(rtts)
	q := func(p float64) float64 { return float64(rtts[int(p*float64(len(rtts)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// BenchmarkTerminalEcho times keystroke echo round trips: straight to the agent's PTY
// server (the baseline), and through WebSocket -> control plane -> tunnel (TCP+yamux,
// QUIC) -> agent PTY -> back, idle and while another session floods the same tunnel,
// and through the replica hop. Figures are printed, never asserted.
func BenchmarkTerminalEcho(b *testing.B) {
	w := benchWorld(b)
	runFabric(b, w.App)
	runTerminal(b, w.App, w.Server.URL)
	tcp := w.agentNode(b, w.App, fabricnet.ModeTCP, nodeterm.Options{})
	onTCP := w.activeAllocation(b, tcp.id, tcp)
	quic := w.agentNode(b, w.App, fabricnet.ModeQUIC, nodeterm.Options{})
	onQUIC := w.activeAllocation(b, quic.id, quic)
	rb, srvB := w.secondReplica(b, "rb")
	runFabric(b, rb)
	runTerminal(b, rb, srvB.URL)

	echo := func(b *testing.B, base string, alloc uuid.UUID) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, err := terminal.DialBench(ctx, base, alloc, w.mustMint(b, alloc, api.TerminalSessionCreateRequest{}).Token, http.Header{})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if _, err := c.EchoRoundTrips(ctx, 20); err != nil { // warm up past the prompt
			b.Fatal(err)
		}
		b.ResetTimer()
		rtts, err := c.EchoRoundTrips(ctx, b.N)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		reportRTT(b, rtts)
	}

	directEcho := func(b *testing.B) {
		cp, data := directPTY(b)
		until := func(k byte) {
			for p := range data {
				if bytes.IndexByte(p, k) >= 0 {
					return
				}
			}
			b.Fatal("stream ended")
		}
		round := func(i int) time.Duration {
			k := byte('a' + i%26)
			if i > 0 && i%100 == 0 {
				_ = termproto.WriteData(cp, []byte{0x15})
			}
			start := time.Now()
			if err := termproto.WriteData(cp, []byte{k}); err != nil {
				b.Fatal(err)
			}
			until(k)
			return time.Since(start)
		}
		for i := 0; i < 20; i++ {
			round(i)
		}
		b.ResetTimer()
		rtts := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N; i++ {
			rtts = append(rtts, round(i))
		}
		b.StopTimer()
		reportRTT(b, rtts)
	}
	// flood floods alloc's tunnel with a second session's bulk output until the returned
	// stop is called; stop reports the bulk megabytes moved.
	flood := func(b *testing.B, alloc uuid.UUID, bytesPerSecond int64) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		c, err := terminal.DialBench(ctx, w.Server.URL, alloc, w.mustMint(b, alloc, api.TerminalSessionCreateRequest{}).Token, http.Header{})
		if err != nil {
			b.Fatal(err)
		}
		type result struct {
			n       int64
			elapsed time.Duration
		}
		done := make(chan result)
		go func() {
			n, elapsed, _ := c.PacedThroughput(ctx, "cat /dev/zero | tr '\\0' x", bytesPerSecond)
			done <- result{n, elapsed}
		}()
		return func() {
			// Stop the command and end the session with a normal closure before the
			// reader's context goes: a dropped WebSocket would leave the session
			// detached for its grace period, its command still streaming into the
			// replay ring and taking CPU from the next measurement.
			_ = c.Interrupt(context.Background())
			_ = c.Close()
			cancel()
			r := <-done
			b.ReportMetric(float64(r.n)/1e6/r.elapsed.Seconds(), "bulk-MB/s")
		}
	}
	b.Run("pty-direct", directEcho)
	b.Run("ws-tcp", func(b *testing.B) { echo(b, w.Server.URL, onTCP.ID) })
	b.Run("ws-quic", func(b *testing.B) { echo(b, w.Server.URL, onQUIC.ID) })
	b.Run("ws-relay-tcp", func(b *testing.B) { echo(b, srvB.URL, onTCP.ID) })
	// Under bulk: a second session on the same tunnel streams `cat /dev/zero` output.
	// Unpaced, its browser reads as fast as it can, and on a small machine that runs
	// every party (shells, agent, control plane, both browsers) the bulk takes all the
	// cores: the direct PTY echo is measured under the same bulk as the baseline, so that
	// "added" is what the path adds rather than the CPU contention. Paced, the bulk's
	// browser renders 16 MB/s (a fast browser terminal), the tunnel carries a steady bulk
	// stream with backpressure, and the cores are not all taken.
	const pace = 16 << 20
	for _, tc := range []struct {
		name  string
		alloc uuid.UUID
		pace  int64
		ws    bool
	}{
		{"pty-direct-under-bulk", onTCP.ID, 0, false},
		{"ws-tcp-under-bulk", onTCP.ID, 0, true},
		{"ws-quic-under-bulk", onQUIC.ID, 0, true},
		{"pty-direct-under-paced-bulk", onTCP.ID, pace, false},
		{"ws-tcp-under-paced-bulk", onTCP.ID, pace, true},
		{"ws-quic-under-paced-bulk", onQUIC.ID, pace, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			stop := flood(b, tc.alloc, tc.pace)
			if tc.ws {
				echo(b, w.Server.URL, tc.alloc)
			} else {
				directEcho(b)
			}
			stop()
		})
	}
}

// BenchmarkTerminalThroughput counts the output of a 64 MiB command through the
// whole path (MB/s is printed), against the agent's PTY server alone.
func BenchmarkTerminalThroughput(b *testing.B) {
	w := benchWorld(b)
	runFabric(b, w.App)
	const command = "head -c 67108864 /dev/zero | tr '\\0' x"
	b.Run("pty-direct", func(b *testing.B) {
		cp, data := directPTY(b)
		marker := []byte("__GANTRY_BENCH_42__")
		b.ResetTimer()
		var total int64
		for i := 0; i < b.N; i++ {
			if err := termproto.WriteData(cp, []byte(command+"; echo __GANTRY_BENCH_$((40+2))__\r")); err != nil {
				b.Fatal(err)
			}
			var tail []byte
			for p := range data {
				total += int64(len(p))
				tail = append(tail, p...)
				if bytes.Contains(tail, marker) {
					break
				}
				if len(tail) > len(marker) {
					tail = tail[len(tail)-len(marker):]
				}
			}
		}
		b.SetBytes(total / int64(b.N))
	})
	for _, mode := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		node := w.agentNode(b, w.App, mode, nodeterm.Options{})
		alloc := w.activeAllocation(b, node.id, node)
		b.Run("ws-"+string(mode), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c, err := terminal.DialBench(ctx, w.Server.URL, alloc.ID, w.mustMint(b, alloc.ID, api.TerminalSessionCreateRequest{}).Token, http.Header{})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.ResetTimer()
			var total int64
			for i := 0; i < b.N; i++ {
				n, _, err := c.Throughput(ctx, command)
				if err != nil {
					b.Fatal(err)
				}
				total += n
			}
			b.SetBytes(total / int64(b.N))
		})
	}
}

// directPTY is the baseline: the agent's PTY server on a fresh session over an
// in-memory pipe (no WebSocket, control plane or tunnel). It returns the control
// plane's end and the data frames read from it.
func directPTY(b *testing.B) (net.Conn, <-chan []byte) {
	envs := &liveEnvs{t: b, m: map[string]nodeterm.SessionEnv{}}
	alloc := uuid.New()
	envs.add(alloc)
	srv := nodeterm.New(envs, nodeterm.Options{})
	b.Cleanup(srv.Close)
	cp, ag := net.Pipe()
	b.Cleanup(func() { _ = cp.Close() })
	go srv.ServeStream(context.Background(), &fabricv1.StreamPreamble{
		Kind: fabricv1.StreamKind_STREAM_KIND_TERMINAL, StreamId: uuid.NewString(), AllocationId: alloc.String(),
		TerminalSize: &fabricv1.TerminalSize{Cols: 80, Rows: 24},
	}, ag)
	var rep fabricv1.StreamReply
	if err := fabricnet.ReadFrame(cp, &rep); err != nil || !rep.GetOk() {
		b.Fatalf("reply %v %v", &rep, err)
	}
	// net.Pipe is synchronous: read every frame in the background.
	data := make(chan []byte, 1024)
	go func() {
		defer close(data)
		buf := make([]byte, termproto.MaxPayload)
		for {
			typ, p, err := termproto.ReadFrame(cp, buf)
			if err != nil {
				return
			}
			if typ == termproto.FrameData {
				data <- append([]byte(nil), p...)
			}
		}
	}()
	return cp, data
}

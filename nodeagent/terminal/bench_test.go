package terminal

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/gantry-gpu/gantry/shared/fabricnet"
	"github.com/google/uuid"
)

// The agent's share of the terminal benchmark (go test -run ^$ -bench . ./terminal):
// keystroke echo and bulk output on a direct local PTY (the baseline) and through a
// session served over net.Pipe and over both fabric transports on loopback. The whole
// browser path (WebSocket, control plane, tunnel) is the bench program's to measure.

type opener func(b *testing.B, argv []string) io.ReadWriter

func openers() []struct {
	name string
	open opener
} {
	session := func(mode fabricnet.Mode) opener {
		return func(b *testing.B, argv []string) io.ReadWriter {
			srv, _, alloc := newServer(b, Options{})
			pre := preamble(uuid.NewString(), alloc, argv...)
			if mode == "" {
				c := open(b, srv, pre, true)
				if !c.rep.GetOk() {
					b.Fatalf("refused: %+v", c.rep)
				}
				// net.Pipe has no buffer: a reader running ahead lets the keystroke's write
				// and the agent's ready frame cross, as any real stream's buffer does.
				pr, pw := io.Pipe()
				go func() { _, err := io.Copy(pw, c.conn); pw.CloseWithError(err) }()
				return NewFrameConn(struct {
					io.Reader
					io.Writer
				}{pr, c.conn})
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			st, err := fabricnet.OpenRaw(ctx, tunnel(b, srv, mode), pre)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = st.Close() })
			return NewFrameConn(st)
		}
	}
	return []struct {
		name string
		open opener
	}{
		{"local-pty", func(b *testing.B, argv []string) io.ReadWriter {
			rw, err := LocalEcho(argv...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = rw.Close() })
			return rw
		}},
		{"session-pipe", session("")},
		{"session-quic", session(fabricnet.ModeQUIC)},
		{"session-tcp", session(fabricnet.ModeTCP)},
	}
}

func BenchmarkEchoRoundTrip(b *testing.B) {
	for _, o := range openers() {
		b.Run(o.name, func(b *testing.B) {
			rw := o.open(b, EchoCommand)
			b.ResetTimer()
			rtts, err := EchoRoundTrip(rw, b.N)
			if err != nil {
				b.Fatal(err)
			}
			slices.Sort(rtts)
			b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(rtts[len(rtts)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

func BenchmarkOutput(b *testing.B) {
	const size = 16 << 20
	argv := []string{"/bin/sh", "-c", fmt.Sprintf(`stty -echo; head -c %d /dev/zero | tr '\0' x; echo; echo DO\NE; exec cat >/dev/null`, size)}
	for _, o := range openers() {
		b.Run(o.name, func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				b.StopTimer()
				rw := o.open(b, argv)
				b.StartTimer()
				if _, err := ReadUntil(rw, []byte("DONE")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

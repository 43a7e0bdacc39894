package fabricnet_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// BenchmarkStreamWrite pushes 64 KiB writes through one stream of each transport and
// through a direct TLS/TCP connection (the baseline), for CPU profiles of the tunnel's
// data path. The bench program (gantry-bench -only fabric) reports the ratios.
func BenchmarkStreamWrite(b *testing.B) {
	srvTLS, cliTLS := certs(b)
	ln, err := fabricnet.Listen("127.0.0.1:0", srvTLS, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	go func() {
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
					go func() { _, _ = io.Copy(io.Discard, st); _ = st.Close() }()
				}
			}()
		}
	}()
	direct, err := tls.Listen("tcp", "127.0.0.1:0", alpn(srvTLS))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = direct.Close() })
	go func() {
		for {
			c, err := direct.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	cli := cliTLS.Clone()
	cli.ServerName = "127.0.0.1"

	write := func(b *testing.B, c net.Conn) { writeChunks(b, c, 64<<10) }
	b.Run("direct-tls", func(b *testing.B) {
		c, err := tls.Dial("tcp", direct.Addr().String(), alpn(cli))
		if err != nil {
			b.Fatal(err)
		}
		write(b, c)
	})
	for _, m := range []fabricnet.Mode{fabricnet.ModeTCP, fabricnet.ModeQUIC} {
		b.Run(string(m), func(b *testing.B) {
			s, err := fabricnet.Dial(context.Background(), ln.Addr().String(), m, cli, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close("bench done")
			st, err := s.OpenStream(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			write(b, st)
		})
	}
	// The app proxy's agent writes what it reads from the app's socket: 32 KiB at a time
	// with io.Copy, 256 KiB since (nodeagent/apps copy.go).
	for _, size := range []int{32 << 10, 64 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("tcp-writes-%dKiB", size>>10), func(b *testing.B) {
			s, err := fabricnet.Dial(context.Background(), ln.Addr().String(), fabricnet.ModeTCP, cli, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close("bench done")
			st, err := s.OpenStream(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			writeChunks(b, st, size)
		})
	}
}

// writeChunks writes size-byte chunks to c b.N times and reports the CPU this process
// spent per GiB (both ends of the stream are in it): on a shared machine that moves far
// less than the rate does.
func writeChunks(b *testing.B, c net.Conn, size int) {
	defer c.Close()
	buf := make([]byte, size)
	buf[0] = 'd'
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	c0 := processCPU()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((processCPU()-c0).Seconds()/(float64(b.N)*float64(size)/(1<<30)), "cpu-s/GiB")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func alpn(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.NextProtos = []string{fabricnet.ALPN}
	return c
}

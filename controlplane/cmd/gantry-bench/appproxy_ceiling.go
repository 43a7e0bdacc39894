package main

// The app proxy's download against the chain it runs on: the proxied bytes cross three
// loopback sockets (app → agent, agent → control plane inside the tunnel's TLS, control
// plane → client) where the direct download crosses one, and are sealed and opened once.
// bareChain builds that chain with nothing else in it (no HTTP parsing in the relay, no
// yamux, no auth) so the report can say how close the proxy comes to what a plain
// implementation of the same chain does here, as the storage bench's bare handler does
// for its GET. (The proxy came out at 0.86-0.91x of its CPU per GiB: the tunnel's writer
// seals the frames of several reads into one socket write, the bare chain one per read.)
// The CPU cost of each path against direct's gives the bound the report prints.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"sync"
	"time"
)

// chainBuffers are the bare chain's copy sizes, each measured: 32 KiB (io.Copy's) and
// 256 KiB; larger was not cheaper on the development machine, and the report takes
// whichever costs less.
var chainBuffers = []int{32 << 10, 256 << 10}

// bareChain is client → relay (TCP, bytes copied as they are) → TLS over loopback →
// "agent" (TLS terminated, bytes copied as they are) → app, all in this process but the
// app. Its address is the relay's.
type bareChain struct {
	relay, agent net.Listener
	buffer       int
	wg           sync.WaitGroup
}

func newBareChain(appAddr string, buffer int) (*bareChain, error) {
	cert, err := selfSignedCert()
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	agentLn := gatheringListener{tcpLn, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}}
	relayLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = agentLn.Close()
		return nil, err
	}
	c := &bareChain{relay: relayLn, agent: agentLn, buffer: buffer}
	agentAddr := agentLn.Addr().String()
	clientTLS := &tls.Config{RootCAs: pool, ServerName: "bare-chain", MinVersion: tls.VersionTLS13}
	c.serve(agentLn, func() (net.Conn, error) { return net.Dial("tcp", appAddr) })
	c.serve(relayLn, func() (net.Conn, error) { return tls.Dial("tcp", agentAddr, clientTLS) })
	return c, nil
}

func (c *bareChain) Addr() string { return c.relay.Addr().String() }

func (c *bareChain) Close() {
	_ = c.relay.Close()
	_ = c.agent.Close()
	c.wg.Wait()
}

// serve accepts on ln and joins each connection to a fresh one from dial.
func (c *bareChain) serve(ln net.Listener, dial func() (net.Conn, error)) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				out, err := dial()
				if err != nil {
					_ = in.Close()
					return
				}
				join(in, out, c.buffer)
			}()
		}
	}()
}

// gatheringListener is a TLS listener whose connections write all the records of one
// Write with one syscall (crypto/tls writes each 16 KiB record with its own): the
// fabric's tunnel does the same (fabricnet's corkConn), and the ceiling must not be
// lower than the proxy for want of it.
type gatheringListener struct {
	net.Listener
	conf *tls.Config
}

func (l gatheringListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	g := &gatherConn{Conn: c}
	return &gatheredTLS{Conn: tls.Server(g, l.conf), raw: g}, nil
}

type gatherConn struct {
	net.Conn
	mu        sync.Mutex
	gathering bool
	buf       []byte
}

func (g *gatherConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.gathering {
		return g.Conn.Write(p)
	}
	g.buf = append(g.buf, p...)
	return len(p), nil
}

func (g *gatherConn) gather(on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gathering = on
	if on || len(g.buf) == 0 {
		return nil
	}
	_, err := g.Conn.Write(g.buf)
	g.buf = g.buf[:0]
	return err
}

type gatheredTLS struct {
	*tls.Conn
	raw *gatherConn
}

func (c *gatheredTLS) Write(p []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	_ = c.raw.gather(true)
	n, err := c.Conn.Write(p)
	if ferr := c.raw.gather(false); err == nil {
		err = ferr
	}
	return n, err
}

// join copies both ways through buffers of size bytes (the net.Conns' own
// ReadFrom/WriteTo would copy through 32 KiB) and closes both when both ends are done.
func join(a, b net.Conn, size int) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, size)
		_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}

func selfSignedCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bare-chain"}, DNSNames: []string{"bare-chain"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// transfer is one download: its rate, and the CPU it cost this process (client, control
// plane, agent, relay: user and system time) and the app process, per GiB moved.
type transfer struct {
	bps       float64
	cpuPerGiB float64
	cores     float64 // CPU seconds per wall second
}

// measuredDownload is download with the CPU of this process and of the app (pid).
func measuredDownload(url, token string, appPID int) (transfer, error) {
	if appPID == 0 {
		return transfer{}, errors.New("the app's pid is unknown")
	}
	c0, a0, t0 := processCPU(), procCPU(appPID), time.Now()
	bps, err := download(url, token)
	if err != nil {
		return transfer{}, err
	}
	wall := time.Since(t0).Seconds()
	cpu := (processCPU() - c0 + procCPU(appPID) - a0).Seconds()
	return transfer{bps: bps, cpuPerGiB: cpu / (appBig / float64(1<<30)), cores: cpu / wall}, nil
}

func medianTransfer(xs []transfer) transfer {
	var b, c, k []float64
	for _, x := range xs {
		b, c, k = append(b, x.bps), append(c, x.cpuPerGiB), append(k, x.cores)
	}
	return transfer{bps: median(b), cpuPerGiB: median(c), cores: median(k)}
}

// cpuBound is the rate the whole machine's cores could reach at this CPU cost, MB/s.
func (t transfer) cpuBound() float64 {
	return float64(runtimeCPUs()) / t.cpuPerGiB * float64(1<<30) / 1e6
}

func (t transfer) String() string {
	return fmt.Sprintf("%.0f MB/s, %.2f CPU s/GiB (%.2f cores busy; CPU-bound rate %.0f MB/s)", t.bps/1e6, t.cpuPerGiB, t.cores, t.cpuBound())
}

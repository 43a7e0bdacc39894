package apps

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// TestCopyFromAppKeepsTheBytesInOrder: what the app writes, in writes of every size and
// with pauses in between (the copy then waits without a buffer), reaches the stream whole
// and in order, and the app's half close ends the copy with no error.
func TestCopyFromAppKeepsTheBytesInOrder(t *testing.T) {
	app, agent := loopbackPair(t)
	want := make([]byte, 3*fromAppBuffer+12345)
	for i := range want {
		want[i] = byte(i * 31)
	}
	go func() {
		rest := want
		for i := 0; len(rest) > 0; i++ {
			n := min(len(rest), []int{1, 7 << 10, fromAppBuffer + 1, 64 << 10}[i%4])
			if _, err := app.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
			if i%3 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		_ = app.(*net.TCPConn).CloseWrite()
	}()
	var got bytes.Buffer
	if err := copyFromApp(&got, agent.(*net.TCPConn)); err != nil {
		t.Fatalf("copy: %v", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("got %d bytes, want %d (or not the same bytes)", got.Len(), len(want))
	}
}

// TestCopyFromAppEnds: a failing write side and a closed app side each end the copy
// with an error, whether the copy is waiting for the app or writing.
func TestCopyFromAppEnds(t *testing.T) {
	app, agent := loopbackPair(t)
	if _, err := app.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := copyFromApp(failingWriter{}, agent.(*net.TCPConn)); err != io.ErrClosedPipe {
		t.Fatalf("write failure: %v, want io.ErrClosedPipe", err)
	}

	_, agent = loopbackPair(t)
	done := make(chan error, 1)
	go func() { done <- copyFromApp(io.Discard, agent.(*net.TCPConn)) }()
	time.Sleep(10 * time.Millisecond) // most likely waiting for the app by now
	_ = agent.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("copy from a closed connection ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("copy did not end when its connection was closed")
	}
}

// TestIdleCopiesHoldNoBuffer: copies waiting on apps that send nothing (idle WebSockets)
// hold no copy buffer; one taken for bytes that arrived is given back once they are
// passed on.
func TestIdleCopiesHoldNoBuffer(t *testing.T) {
	base := fromAppBuffersOut.Load()
	const n = 20
	apps := make([]net.Conn, n)
	done := make(chan error, n)
	for i := range apps {
		var agent net.Conn
		apps[i], agent = loopbackPair(t)
		go func() { done <- copyFromApp(io.Discard, agent.(*net.TCPConn)) }()
	}
	// Each copy passes one message on, then waits for the next.
	for _, a := range apps {
		if _, err := a.Write(make([]byte, 40<<10)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for fromAppBuffersOut.Load() != base {
		if time.Now().After(deadline) {
			t.Fatalf("%d buffers held by %d idle copies", fromAppBuffersOut.Load()-base, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, a := range apps {
		_ = a.(*net.TCPConn).CloseWrite()
	}
	for range apps {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func loopbackPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

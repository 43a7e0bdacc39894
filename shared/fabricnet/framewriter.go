package fabricnet

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
)

// yamux's send loop writes each data frame as two Writes, its 12-byte header and then
// its body, and crypto/tls turns every Write into records written one syscall each: a
// 64 KiB frame cost five writes to the socket (the header's record and four 16 KiB
// records), against four for the same bytes on a bare TLS connection, and the lone
// 12-byte segment woke the receiver once more. frameConn holds a data frame's header
// until its body arrives and lets the TLS layer seal the whole frame into one buffer
// (corkConn) that goes to the socket in one write. A profile of a single bulk stream had
// put a third of the tunnel's CPU in those syscalls.

// yamux's frame header: version, type, flags (2), stream id (4), length (4).
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
	// corkLimit bounds what one frame buffers before it is written out anyway, so that a
	// window-sized frame (1 MiB) does not keep a 1 MiB buffer per tunnel.
	corkLimit = 256 << 10
)

// corkBuffers are shared by every tunnel: an idle tunnel holds none.
var corkBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 80<<10); return &b }}

// corkConn is the TCP connection under the tunnel's TLS connection. Between cork and
// uncork, writes (TLS records) are gathered and written together; otherwise they go
// straight through (the handshake, alerts).
type corkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    *[]byte
}

func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork writes what was gathered and returns its buffer to the pool.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.flushLocked()
}

func (c *corkConn) flushLocked() error {
	if c.buf == nil {
		return nil
	}
	b := *c.buf
	var err error
	if len(b) > 0 {
		_, err = c.Conn.Write(b)
	}
	*c.buf = b[:0]
	corkBuffers.Put(c.buf)
	c.buf = nil
	return err
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return c.Conn.Write(p)
	}
	if c.buf != nil && len(*c.buf)+len(p) > corkLimit {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) > corkLimit {
		return c.Conn.Write(p)
	}
	if c.buf == nil {
		c.buf = corkBuffers.Get().(*[]byte)
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

// frameConn is the connection yamux writes to: the TLS connection, with each data
// frame's header held back and written together with its body under one cork.
type frameConn struct {
	*tls.Conn
	raw *corkConn

	mu   sync.Mutex
	hdr  [yamuxHeaderSize]byte
	held bool
}

// newFrameConn wraps tcp in TLS (client or server side) for a yamux session.
func newFrameConn(tcp net.Conn, conf *tls.Config, server bool) *frameConn {
	raw := &corkConn{Conn: tcp}
	var tc *tls.Conn
	if server {
		tc = tls.Server(raw, conf)
	} else {
		tc = tls.Client(raw, conf)
	}
	return &frameConn{Conn: tc, raw: raw}
}

// isDataHeader says whether p is exactly a yamux data frame header announcing a body,
// which yamux's send loop writes next.
func isDataHeader(p []byte) bool {
	return len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0
}

func (f *frameConn) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.held && isDataHeader(p) {
		copy(f.hdr[:], p)
		f.held = true
		return len(p), nil
	}
	if !f.held {
		return f.Conn.Write(p)
	}
	// The held header goes first whatever p is, so the byte stream is always exactly
	// what yamux wrote; normally p is that header's body.
	f.held = false
	f.raw.cork()
	_, err := f.Conn.Write(f.hdr[:])
	n := 0
	if err == nil {
		n, err = f.Conn.Write(p)
	}
	if ferr := f.raw.uncork(); err == nil && ferr != nil {
		err, n = ferr, 0
	}
	return n, err
}

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

// buffers hold queued frames (frameConn) and sealed records being gathered (corkConn);
// shared by every tunnel, so an idle tunnel holds none. Take them with getBuffer and
// give them back with putBuffer only: a buffer must come out empty, since corkConn
// appends to what it gets. (Frames a closing tunnel still had queued once went back
// with their plaintext in them, and the next tunnel's corkConn sent that plaintext
// ahead of its records: the peer's TLS layer saw "record with version 100" and ended
// the tunnel.)
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 80<<10); return &b }}

func getBuffer() *[]byte {
	bp := buffers.Get().(*[]byte)
	*bp = (*bp)[:0]
	return bp
}

func putBuffer(bp *[]byte) {
	*bp = (*bp)[:0]
	buffers.Put(bp)
}

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
	putBuffer(c.buf)
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
		c.buf = getBuffer()
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

// frameConn is the connection yamux writes to: the TLS connection, with each data
// frame's header held back and written together with its body under one cork.
//
// The writes themselves happen on a drain goroutine. yamux's send loop waits for each
// frame's write before it tells the stream's writer, which only then hands over the
// next frame: frame after frame, one of the two cores sat idle during the handoffs
// (a single stream used 1.3 cores where a bare TLS connection used 1.7). With the frame
// copied and queued, the send loop takes the next frame while the previous one is sealed
// and written. At most maxQueuedBytes of frames wait (or one frame of any size), so a
// slow peer still blocks the send loop (and with it the streams' writers); the drain
// goroutine exists only while frames are queued, so an idle tunnel costs no goroutine.
//
// The drain goroutine takes every frame queued while it was writing and writes them
// under one cork: small frames (an SSH server's replies to an SFTP upload, one per
// 32 KiB received, window updates) then share a socket write, and the peer one wakeup,
// where each took its own before.
type frameConn struct {
	*tls.Conn
	raw *corkConn

	hdr  [yamuxHeaderSize]byte
	held bool

	mu      sync.Mutex
	space   sync.Cond // queued frames were taken, or the writer failed or closed
	queue   []*[]byte
	queued  int // bytes in queue
	running bool
	err     error
	batch   []*[]byte // the drain goroutine's frames being written
}

// maxQueuedBytes bounds what waits for the drain goroutine: two 64 KiB frames of a bulk
// stream, as the two frames the queue held before, or many small ones.
const maxQueuedBytes = 128 << 10

// newFrameConn wraps tcp in TLS (client or server side) for a yamux session.
func newFrameConn(tcp net.Conn, conf *tls.Config, server bool) *frameConn {
	raw := &corkConn{Conn: tcp}
	var tc *tls.Conn
	if server {
		tc = tls.Server(raw, conf)
	} else {
		tc = tls.Client(raw, conf)
	}
	f := &frameConn{Conn: tc, raw: raw}
	f.space.L = &f.mu
	return f
}

// isDataHeader says whether p is exactly a yamux data frame header announcing a body,
// which yamux's send loop writes next.
func isDataHeader(p []byte) bool {
	return len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0
}

// Write is called by yamux's send loop only. A write error surfaces on a later Write (and
// the connection is closed at once, so the session's receive loop ends too).
func (f *frameConn) Write(p []byte) (int, error) {
	if !f.held && isDataHeader(p) {
		copy(f.hdr[:], p)
		f.held = true
		return len(p), nil
	}
	// The held header goes first whatever p is, so the byte stream is always exactly
	// what yamux wrote; normally p is that header's body.
	bp := getBuffer()
	b := *bp
	if f.held {
		b = append(b, f.hdr[:]...)
		f.held = false
	}
	*bp = append(b, p...)

	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.queue) > 0 && f.queued+len(*bp) > maxQueuedBytes && f.err == nil {
		f.space.Wait()
	}
	if f.err != nil {
		putBuffer(bp)
		return 0, f.err
	}
	f.queue = append(f.queue, bp)
	f.queued += len(*bp)
	if !f.running {
		f.running = true
		go f.drain()
	}
	return len(p), nil
}

// drain writes the queued frames in order, all that are queued at a time under one
// cork, and ends when the queue is empty.
func (f *frameConn) drain() {
	for {
		f.mu.Lock()
		if len(f.queue) == 0 || f.err != nil {
			f.running = false
			f.mu.Unlock()
			return
		}
		batch := append(f.batch[:0], f.queue...)
		clear(f.queue)
		f.queue, f.queued = f.queue[:0], 0
		f.space.Broadcast()
		f.mu.Unlock()

		f.raw.cork()
		var err error
		for _, bp := range batch {
			if err == nil {
				_, err = f.Conn.Write(*bp)
			}
			putBuffer(bp)
		}
		if ferr := f.raw.uncork(); err == nil {
			err = ferr
		}
		clear(batch)
		f.batch = batch[:0]
		if err != nil {
			f.fail(err)
		}
	}
}

func (f *frameConn) fail(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	for _, bp := range f.queue {
		putBuffer(bp)
	}
	f.queue, f.queued = nil, 0
	f.space.Broadcast()
	f.mu.Unlock()
	_ = f.raw.Conn.Close()
}

// Close stops the writer (frames still queued are dropped: the connection is going)
// and closes the connection.
func (f *frameConn) Close() error {
	f.fail(net.ErrClosed)
	return f.Conn.Close()
}

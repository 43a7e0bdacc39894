package storagemount

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// ChunkSize is the largest data message Write sends (the protocol allows 1 MiB).
const ChunkSize = 1 << 20

// Conns holds the gRPC connection of the agent's current tunnel. The agent sets it when
// a tunnel is established and clears it (Set(nil)) when the tunnel ends, so a call made
// while the tunnel is down waits for the next one instead of failing on a dead one.
type Conns struct {
	mu      sync.Mutex
	cur     *tunnel       // nil while down
	changed chan struct{} // closed and replaced on every Set
}

// tunnel is one established tunnel: its gRPC connection and, when the agent gave it
// (SetTunnel), the session itself, on which reads open raw streams.
type tunnel struct {
	cc   grpc.ClientConnInterface
	sess fabricnet.Session
	// noRaw is set once this tunnel's control plane turned a raw stream away as
	// unknown (an older control plane): its reads go through gRPC from then on.
	noRaw atomic.Bool
	// main is the lane of raw read streams on the tunnel itself; bulk, when the agent
	// gave a SideDialer, the bulk side session beside it (bulk.go), which reads prefer.
	main rawLane
	bulk *bulkSide
}

// lane is where the next raw read stream goes: the bulk side session when it is up,
// else the tunnel (starting the side session's dial when one is due).
func (t *tunnel) lane() (l *rawLane, side bool) {
	if t.bulk != nil {
		if l := t.bulk.current(); l != nil {
			return l, true
		}
	}
	return &t.main, false
}

// NewConns returns an empty holder (no tunnel yet).
func NewConns() *Conns { return &Conns{changed: make(chan struct{})} }

// Set records the current tunnel's connection; nil means the tunnel is down. Reads
// then use gRPC only (SetTunnel gives them the raw path).
func (c *Conns) Set(cc grpc.ClientConnInterface) { c.SetTunnel(cc, nil, nil) }

// SetTunnel records the current tunnel's connection and session (agent.Options.OnTunnel);
// a nil cc means the tunnel is down. With a session, reads fetch their bytes over raw
// streams (fabricnet.AgentStreamStorageRead) instead of StorageFabric.Read; with a
// side dialer too (bulk connections, or a QUIC tunnel's bulk side session), over what
// it dials beside the tunnel once the first dial succeeded (bulk.go), which ends with
// the tunnel.
func (c *Conns) SetTunnel(cc grpc.ClientConnInterface, sess fabricnet.Session, side fabricnet.SideDialer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && c.cur.bulk != nil {
		c.cur.bulk.close()
	}
	c.cur = nil
	if cc != nil {
		c.cur = &tunnel{cc: cc, sess: sess, main: rawLane{sess: sess}}
		if sess != nil && side != nil {
			c.cur.bulk = newBulkSide(side)
		}
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

// current returns the tunnel (nil when down) and a channel closed when it changes.
func (c *Conns) current() (*tunnel, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.changed
}

// Wait returns the current tunnel's connection, waiting for one until ctx ends (other
// services on the tunnel use it: the app supervisor fetches artifacts with it).
func (c *Conns) Wait(ctx context.Context) (grpc.ClientConnInterface, error) {
	t, err := c.get(ctx, nil, 0)
	if err != nil {
		return nil, err
	}
	return t.cc, nil
}

// get waits for a tunnel other than not (nil: any) or for ctx to end. A tunnel that
// is up but was seen failing is retried after backoff, since the agent may not have
// noticed the failure yet (or the control plane's storage backend was briefly down).
func (c *Conns) get(ctx context.Context, not *tunnel, backoff time.Duration) (*tunnel, error) {
	var timer <-chan time.Time
	if not != nil {
		t := time.NewTimer(backoff)
		defer t.Stop()
		timer = t.C
	}
	for {
		t, changed := c.current()
		if t != nil && (not == nil || t != not) {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-changed:
		case <-timer:
			not, timer = nil, nil
		}
	}
}

// Client calls StorageFabric on the current tunnel. Lists, stats and reads are retried
// on UNAVAILABLE (after the tunnel comes back, or after a backoff) for up to RetryFor,
// since repeating them is harmless; writes and deletes are not retried here (the caller
// decides: an upload from a file can start over, a delete that may have happened
// cannot be blindly repeated).
type Client struct {
	conns *Conns
	// RetryFor bounds how long an idempotent call keeps retrying UNAVAILABLE.
	RetryFor time.Duration
	// Backoff is the wait before retrying on the same connection.
	Backoff time.Duration
}

// Defaults for Client.
const (
	DefaultRetryFor = 60 * time.Second
	DefaultBackoff  = 250 * time.Millisecond
)

// NewClient returns a Client over conns.
func NewClient(conns *Conns) *Client {
	return &Client{conns: conns, RetryFor: DefaultRetryFor, Backoff: DefaultBackoff}
}

// idempotent runs call until it succeeds, fails with something other than
// UNAVAILABLE, or RetryFor has passed. While no tunnel is up, it waits (within RetryFor).
func (c *Client) idempotent(ctx context.Context, call func(fabricv1.StorageFabricClient) error) error {
	return c.idempotentOn(ctx, func(t *tunnel) error { return call(fabricv1.NewStorageFabricClient(t.cc)) })
}

// idempotentOn is idempotent for calls that need the tunnel itself (raw streams).
func (c *Client) idempotentOn(ctx context.Context, call func(*tunnel) error) error {
	rctx, cancel := context.WithTimeout(ctx, c.RetryFor)
	defer cancel()
	var bad *tunnel
	var last error
	for {
		t, err := c.conns.get(rctx, bad, c.Backoff)
		if err != nil {
			if ctx.Err() == nil && last != nil {
				return last
			}
			if ctx.Err() == nil {
				return status.Error(codes.Unavailable, "storage: no fabric tunnel")
			}
			return err
		}
		err = call(t)
		if !retriable(ctx, err) {
			return err
		}
		bad, last = t, err
	}
}

// retriable reports whether err says the tunnel (not the call) failed: UNAVAILABLE, or
// CANCELED while the caller's context is live (gRPC's "the client connection is
// closing", when the agent closed the connection of a tunnel that ended).
func retriable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled:
		return true
	}
	return false
}

// once runs call on the current connection, waiting for one within RetryFor.
func (c *Client) once(ctx context.Context) (fabricv1.StorageFabricClient, error) {
	rctx, cancel := context.WithTimeout(ctx, c.RetryFor)
	defer cancel()
	t, err := c.conns.get(rctx, nil, 0)
	if err != nil {
		if ctx.Err() == nil {
			return nil, status.Error(codes.Unavailable, "storage: no fabric tunnel")
		}
		return nil, err
	}
	return fabricv1.NewStorageFabricClient(t.cc), nil
}

// List returns one page of objects under prefix ("/" delimiter: one folder level).
func (c *Client) List(ctx context.Context, attachmentID, prefix, delimiter, cursor string, limit int) (*fabricv1.StorageListResponse, error) {
	var out *fabricv1.StorageListResponse
	err := c.idempotent(ctx, func(sc fabricv1.StorageFabricClient) error {
		var err error
		out, err = sc.List(ctx, &fabricv1.StorageListRequest{AttachmentId: attachmentID, Prefix: prefix, Delimiter: delimiter, Cursor: cursor, Limit: uint32(limit)})
		return err
	})
	return out, err
}

// ListAll calls fn for every object under prefix (recursive), page by page.
func (c *Client) ListAll(ctx context.Context, attachmentID, prefix string, fn func(*fabricv1.StorageObjectInfo) error) error {
	cursor := ""
	for {
		page, err := c.List(ctx, attachmentID, prefix, "", cursor, 1000)
		if err != nil {
			return err
		}
		for _, e := range page.GetEntries() {
			if err := fn(e); err != nil {
				return err
			}
		}
		if cursor = page.GetNextCursor(); cursor == "" {
			return nil
		}
	}
}

// Stat returns one object's metadata.
func (c *Client) Stat(ctx context.Context, attachmentID, path string) (*fabricv1.StorageObjectInfo, error) {
	var out *fabricv1.StorageObjectInfo
	err := c.idempotent(ctx, func(sc fabricv1.StorageFabricClient) error {
		var err error
		out, err = sc.Stat(ctx, &fabricv1.StorageStatRequest{AttachmentId: attachmentID, Path: path})
		return err
	})
	return out, err
}

// Delete removes one object. Not retried: see Client.
func (c *Client) Delete(ctx context.Context, attachmentID, path string) error {
	sc, err := c.once(ctx)
	if err != nil {
		return err
	}
	_, err = sc.Delete(ctx, &fabricv1.StorageDeleteRequest{AttachmentId: attachmentID, Path: path})
	return err
}

// Write uploads size bytes (or, with size -1, everything) from r as path. The object is
// committed when Write returns nil; any error leaves the previous object in place.
func (c *Client) Write(ctx context.Context, attachmentID, path string, r io.Reader, size int64, contentType string) (*fabricv1.StorageObjectInfo, error) {
	sc, err := c.once(ctx)
	if err != nil {
		return nil, err
	}
	// Cancelling the call's context on any local failure makes the server see an
	// aborted stream, never a commit of a short object.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := sc.Write(wctx)
	if err != nil {
		return nil, err
	}
	hdr := &fabricv1.StorageWriteHeader{AttachmentId: attachmentID, Path: path, Size: size, ContentType: contentType}
	if err := st.Send(&fabricv1.StorageWriteRequest{Msg: &fabricv1.StorageWriteRequest_Header{Header: hdr}}); err != nil {
		return nil, recvErr(st, err)
	}
	buf := make([]byte, ChunkSize)
	var sent int64
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if size >= 0 && sent+int64(n) > size {
				return nil, status.Errorf(codes.InvalidArgument, "storage: %s grew beyond %d bytes while uploading", path, size)
			}
			// Send keeps no reference to the message after it returns, so buf is reused.
			if err := st.Send(&fabricv1.StorageWriteRequest{Msg: &fabricv1.StorageWriteRequest_Data{Data: buf[:n]}}); err != nil {
				return nil, recvErr(st, err)
			}
			sent += int64(n)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	if size >= 0 && sent != size {
		return nil, status.Errorf(codes.InvalidArgument, "storage: %s has %d bytes, %d announced", path, sent, size)
	}
	return st.CloseAndRecv()
}

// recvErr turns a failed Send into the server's status: gRPC reports io.EOF from Send
// when the server ended the call, and the reason is in the response.
func recvErr(st fabricv1.StorageFabric_WriteClient, err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := st.CloseAndRecv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// Reader streams [off, off+n) of one object. A stream broken by UNAVAILABLE is resumed
// at the byte where it stopped, pinned to the first stream's etag, so the bytes never
// mix two versions of the object.
//
// On a tunnel the agent gave with its session (Conns.SetTunnel) the bytes come over a
// raw stream (fabricnet.AgentStreamStorageRead: the same request and checks, no gRPC
// framing or protobuf copies); a control plane that does not know raw streams is read
// through StorageFabric.Read.
type Reader struct {
	c            *Client
	ctx          context.Context
	attachmentID string
	path         string
	off, end     int64 // end < 0: to the end of the object
	etag         string
	info         *fabricv1.StorageObjectInfo

	stream  fabricv1.StorageFabric_ReadClient
	raw     *laneStream // the raw stream, instead of stream
	rawStop func() bool // stops raw's close on the context's end
	left    int64       // bytes the raw stream still owes
	stuck   int         // raw streams in a row that broke before yielding a byte
	cancel  context.CancelFunc
	buf     []byte
	done    bool
}

// rawChunk is how many bytes Next returns at most from a raw stream: small enough
// that a prefetched block is readable as it arrives, large enough that the per-call
// cost is nothing. Chunks come from chunkPool; ReleaseChunk gives them back.
const rawChunk = 256 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, rawChunk); return &b }}

// ReleaseChunk gives back a slice Next returned, once the caller is done with it (a
// prefetcher, after copying it out); only raw stream chunks are reused.
func ReleaseChunk(b []byte) {
	if cap(b) == rawChunk {
		b = b[:rawChunk]
		chunkPool.Put(&b)
	}
}

// maxStuck bounds resuming a raw stream that keeps breaking before its first byte
// (the tunnel is fine but the object store is not).
const maxStuck = 3

// Open starts reading n bytes (n <= 0: to the end) at off. ifMatch, when set, pins the
// object version. The first message (with the object's info) has arrived when Open
// returns, so a missing object is reported here.
func (c *Client) Open(ctx context.Context, attachmentID, path string, off, n int64, ifMatch string) (*Reader, error) {
	r := &Reader{c: c, ctx: ctx, attachmentID: attachmentID, path: path, off: off, end: -1, etag: ifMatch}
	if n > 0 {
		r.end = off + n
	}
	if err := r.start(); err != nil {
		return nil, err
	}
	return r, nil
}

// Info is the object's metadata from the first stream.
func (r *Reader) Info() *fabricv1.StorageObjectInfo { return r.info }

func (r *Reader) start() error {
	length := int64(0)
	if r.end >= 0 {
		length = r.end - r.off
		if length <= 0 {
			r.done = true
			return nil
		}
	}
	req := &fabricv1.StorageReadRequest{AttachmentId: r.attachmentID, Path: r.path, Offset: r.off, Length: length, IfMatch: r.etag}
	return r.c.idempotentOn(r.ctx, func(t *tunnel) error {
		if t.sess != nil && !t.noRaw.Load() {
			err := r.startRaw(t, req)
			if !errors.Is(err, errNoRaw) {
				return err
			}
			t.noRaw.Store(true)
		}
		sctx, cancel := context.WithCancel(r.ctx)
		st, err := fabricv1.NewStorageFabricClient(t.cc).Read(sctx, req)
		if err == nil {
			var first *fabricv1.StorageReadChunk
			if first, err = st.Recv(); err == nil {
				if first.GetInfo() == nil {
					err = status.Error(codes.Internal, "storage: read stream without object info")
				} else {
					r.gotInfo(first.GetInfo())
					r.stream, r.cancel, r.buf = st, cancel, first.GetData()
					return nil
				}
			} else if errors.Is(err, io.EOF) {
				err = status.Error(codes.Internal, "storage: read stream ended before the object info")
			}
		}
		cancel()
		return err
	})
}

func (r *Reader) gotInfo(info *fabricv1.StorageObjectInfo) {
	if r.info == nil {
		r.info = info
	}
	if r.etag == "" {
		r.etag = info.GetEtag()
	}
}

// errNoRaw says the control plane does not serve raw read streams.
var errNoRaw = errors.New("storage: no raw read streams on this tunnel")

// startRaw sends req on a raw read stream: on the bulk side session when it is up,
// else (or when the side session fails under it) on the tunnel. Its errors are gRPC
// statuses (the control plane's code, or UNAVAILABLE for a broken tunnel), or errNoRaw.
func (r *Reader) startRaw(t *tunnel, req *fabricv1.StorageReadRequest) error {
	if l, side := t.lane(); side {
		err := r.startRawOn(l, true, req)
		if !errors.Is(err, errLaneFailed) {
			return err
		}
		t.bulk.failed(l)
	}
	return r.startRawOn(&t.main, false, req)
}

// errLaneFailed says a bulk side session failed a stream for a reason other than the
// control plane's answer: the read goes to the tunnel.
var errLaneFailed = errors.New("storage: bulk side session failed")

// startRawOn sends req on an idle raw read stream of lane l, or a new one, and reads
// the info. On a side session (side) a failure that is not the control plane's answer
// is errLaneFailed.
func (r *Reader) startRawOn(l *rawLane, side bool, req *fabricv1.StorageReadRequest) error {
	var st *laneStream
	for st == nil {
		idle := l.takeIdle(time.Now())
		var err error
		if idle != nil {
			if err = fabricnet.AgentStreamRequest(r.ctx, idle, req); err == nil {
				st = idle
				break
			}
		} else if st, err = l.open(r.ctx, req); err == nil {
			break
		}
		if ctxErr := r.ctx.Err(); ctxErr != nil {
			if idle != nil {
				_ = idle.Close()
			}
			return status.FromContextError(ctxErr).Err()
		}
		var ref *fabricnet.StreamRefusedError
		if errors.As(err, &ref) {
			if ref.Code == codes.Unimplemented.String() {
				if idle != nil {
					_ = idle.Close()
				}
				if side {
					return errLaneFailed
				}
				return errNoRaw
			}
			if idle != nil {
				l.putIdle(idle, time.Now()) // a refusal leaves the stream usable
			}
			return status.Error(codeOf(ref.Code), ref.Message)
		}
		if idle != nil {
			// The control plane closed it meanwhile (idle too long): take another.
			_ = idle.Close()
			continue
		}
		if side {
			return errLaneFailed
		}
		select {
		case <-l.sess.Done():
			return status.Errorf(codes.Unavailable, "storage: tunnel ended: %v", err)
		default:
		}
		// The tunnel is up but a new stream ended without an answer: a control plane
		// that predates raw streams gave it to its gRPC server, which dropped it.
		return errNoRaw
	}
	var info fabricv1.StorageObjectInfo
	if err := fabricnet.ReadFrame(st, &info); err != nil {
		_ = st.Close()
		if side && r.ctx.Err() == nil {
			return errLaneFailed
		}
		return status.Errorf(codes.Unavailable, "storage: raw read stream: %v", err)
	}
	r.gotInfo(&info)
	// What the stream owes: the requested range, cut at the object's end.
	end := info.GetSize()
	if r.end >= 0 {
		end = min(end, r.end)
	}
	r.raw, r.left, r.stream = st, max(end-r.off, 0), nil
	// A raw stream's reads do not watch the context: ending it (a prefetched block
	// dropped, the mount going) closes the stream, so the control plane stops sending.
	r.rawStop = context.AfterFunc(r.ctx, func() { _ = st.Close() })
	if r.left == 0 {
		r.finishRaw()
		r.done = true
	}
	return nil
}

// took counts n bytes read from the raw stream; a stream that delivered its whole range
// goes back to the tunnel for the next read.
func (r *Reader) took(n int) {
	r.off += int64(n)
	r.left -= int64(n)
	if n > 0 {
		r.stuck = 0
	}
	if r.left == 0 {
		// A Reader's range is its stream's range (a resumed one ends at the same end).
		r.finishRaw()
		r.done = true
	}
}

// finishRaw gives a raw stream that owes nothing back to its tunnel's idle streams,
// unless the context closed it meanwhile.
func (r *Reader) finishRaw() {
	if r.raw == nil {
		return
	}
	if r.rawStop() {
		r.raw.lane.putIdle(r.raw, time.Now())
	} else {
		_ = r.raw.Close()
	}
	r.raw = nil
}

// idleRaw bounds the raw read streams a tunnel keeps for reuse (a file's prefetch
// uses PrefetchBlocks at once), and rawIdleFor how long one is kept: less than the
// control plane keeps it (30 s), so a stream taken from the pool is seldom closed
// under the request.
const (
	idleRaw    = PrefetchBlocks + 1
	rawIdleFor = 15 * time.Second
)

// codeOf is the gRPC code named name (codes.Code.String), UNKNOWN if none.
func codeOf(name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	return codes.Unknown
}

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if len(r.buf) == 0 && r.raw != nil && len(p) > 0 {
		// Straight from the stream into p: no chunk in between.
		return r.readRaw(p)
	}
	return r.readBuffered(p)
}

// readBuffered is Read from r.buf (a gRPC message, or a chunk fill read).
func (r *Reader) readBuffered(p []byte) (int, error) {
	if err := r.fill(); err != nil {
		return 0, err
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	r.off += int64(n)
	return n, nil
}

// readRaw reads into p what the raw stream yields next (up to what it owes), resuming
// a stream that broke.
func (r *Reader) readRaw(p []byte) (int, error) {
	for {
		if r.done || r.left <= 0 || (r.end >= 0 && r.off >= r.end) {
			r.done = true
			return 0, io.EOF
		}
		if r.raw == nil {
			// Resumed on a tunnel whose control plane reads through gRPC only.
			return r.readBuffered(p)
		}
		n, err := io.ReadAtLeast(r.raw, p[:min(int64(len(p)), r.left)], 1)
		if n > 0 {
			r.took(n)
			return n, nil
		}
		if rerr := r.resumeRaw(err); rerr != nil {
			return 0, rerr
		}
	}
}

// resumeRaw replaces a raw stream that ended owing bytes (err: how it ended) with a new
// stream from r.off, pinned to the same version.
func (r *Reader) resumeRaw(err error) error {
	r.rawStop()
	_ = r.raw.Close()
	r.raw = nil
	if ctxErr := r.ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	if r.stuck++; r.stuck > maxStuck {
		return status.Errorf(codes.Unavailable, "storage: read of %s keeps breaking: %v", r.path, err)
	}
	return r.start()
}

// Next returns the next bytes of the range as they arrived (one message's data, at
// most ChunkSize), or io.EOF after the last. The slice is the caller's: a prefetcher
// keeps it instead of copying it once more (and may give it back, ReleaseChunk).
func (r *Reader) Next() ([]byte, error) {
	if len(r.buf) == 0 && r.raw != nil {
		bp := chunkPool.Get().(*[]byte)
		n, err := r.readRaw((*bp)[:min(int64(rawChunk), max(r.left, 1))])
		if n == 0 {
			chunkPool.Put(bp)
			return nil, err
		}
		// Fill the chunk as far as the stream has bytes at hand, so chunks are seldom
		// small; readRaw returned what one Read gave.
		for n < rawChunk && r.left > 0 && r.raw != nil {
			k, err := r.raw.Read((*bp)[n:min(int64(rawChunk), int64(n)+r.left)])
			n += k
			r.took(k)
			if err != nil || k == 0 {
				break // the next call resumes or ends
			}
		}
		return (*bp)[:n], nil
	}
	if err := r.fill(); err != nil {
		return nil, err
	}
	b := r.buf
	r.buf = nil
	r.off += int64(len(b))
	return b, nil
}

// fill makes r.buf non-empty: the next message, resuming a stream broken by the
// tunnel, or io.EOF.
func (r *Reader) fill() error {
	for len(r.buf) == 0 {
		if r.done || (r.end >= 0 && r.off >= r.end) {
			return io.EOF
		}
		if r.raw != nil {
			// A raw stream fills no message buffer: one chunk is r.buf.
			b, err := r.Next()
			if err != nil {
				return err
			}
			r.off -= int64(len(b)) // Read and Next count it as they consume it
			r.buf = b
			continue
		}
		m, err := r.stream.Recv()
		if errors.Is(err, io.EOF) {
			r.done = true
			return io.EOF
		}
		if retriable(r.ctx, err) {
			// The tunnel dropped mid-object: continue where we are, same version.
			r.cancel()
			if err := r.start(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		r.buf = m.GetData()
	}
	return nil
}

// Close ends the stream.
func (r *Reader) Close() error {
	if r.cancel != nil {
		r.cancel()
	}
	if r.raw != nil {
		// Owing bytes still: the stream cannot serve another range.
		r.rawStop()
		_ = r.raw.Close()
		r.raw = nil
	}
	r.done = true
	return nil
}

package storagemount

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// ChunkSize is the largest data message Write sends (the protocol allows 1 MiB).
const ChunkSize = 1 << 20

// Conns holds the gRPC connection of the agent's current tunnel. The agent sets it when
// a tunnel is established and clears it (Set(nil)) when the tunnel ends, so a call made
// while the tunnel is down waits for the next one instead of failing on a dead one.
type Conns struct {
	mu      sync.Mutex
	cc      grpc.ClientConnInterface
	changed chan struct{} // closed and replaced on every Set
}

// NewConns returns an empty holder (no tunnel yet).
func NewConns() *Conns { return &Conns{changed: make(chan struct{})} }

// Set records the current tunnel's connection; nil means the tunnel is down.
func (c *Conns) Set(cc grpc.ClientConnInterface) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cc = cc
	close(c.changed)
	c.changed = make(chan struct{})
}

// current returns the connection (nil when down) and a channel closed when it changes.
func (c *Conns) current() (grpc.ClientConnInterface, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cc, c.changed
}

// Wait returns the current tunnel's connection, waiting for one until ctx ends (other
// services on the tunnel use it: the app supervisor fetches artifacts with it).
func (c *Conns) Wait(ctx context.Context) (grpc.ClientConnInterface, error) {
	return c.get(ctx, nil, 0)
}

// get waits for a connection other than not (nil: any) or for ctx to end. A tunnel that
// is up but was seen failing is retried after backoff, since the agent may not have
// noticed the failure yet (or the control plane's storage backend was briefly down).
func (c *Conns) get(ctx context.Context, not grpc.ClientConnInterface, backoff time.Duration) (grpc.ClientConnInterface, error) {
	var timer <-chan time.Time
	if not != nil {
		t := time.NewTimer(backoff)
		defer t.Stop()
		timer = t.C
	}
	for {
		cc, changed := c.current()
		if cc != nil && (not == nil || cc != not) {
			return cc, nil
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
	rctx, cancel := context.WithTimeout(ctx, c.RetryFor)
	defer cancel()
	var bad grpc.ClientConnInterface
	var last error
	for {
		cc, err := c.conns.get(rctx, bad, c.Backoff)
		if err != nil {
			if ctx.Err() == nil && last != nil {
				return last
			}
			if ctx.Err() == nil {
				return status.Error(codes.Unavailable, "storage: no fabric tunnel")
			}
			return err
		}
		err = call(fabricv1.NewStorageFabricClient(cc))
		if !retriable(ctx, err) {
			return err
		}
		bad, last = cc, err
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
	cc, err := c.conns.get(rctx, nil, 0)
	if err != nil {
		if ctx.Err() == nil {
			return nil, status.Error(codes.Unavailable, "storage: no fabric tunnel")
		}
		return nil, err
	}
	return fabricv1.NewStorageFabricClient(cc), nil
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
type Reader struct {
	c            *Client
	ctx          context.Context
	attachmentID string
	path         string
	off, end     int64 // end < 0: to the end of the object
	etag         string
	info         *fabricv1.StorageObjectInfo

	stream fabricv1.StorageFabric_ReadClient
	cancel context.CancelFunc
	buf    []byte
	done   bool
}

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
	return r.c.idempotent(r.ctx, func(sc fabricv1.StorageFabricClient) error {
		sctx, cancel := context.WithCancel(r.ctx)
		st, err := sc.Read(sctx, &fabricv1.StorageReadRequest{AttachmentId: r.attachmentID, Path: r.path, Offset: r.off, Length: length, IfMatch: r.etag})
		if err == nil {
			var first *fabricv1.StorageReadChunk
			if first, err = st.Recv(); err == nil {
				if first.GetInfo() == nil {
					err = status.Error(codes.Internal, "storage: read stream without object info")
				} else {
					if r.info == nil {
						r.info = first.GetInfo()
					}
					if r.etag == "" {
						r.etag = first.GetInfo().GetEtag()
					}
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

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if err := r.fill(); err != nil {
		return 0, err
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	r.off += int64(n)
	return n, nil
}

// Next returns the next bytes of the range as they arrived (one message's data, at
// most ChunkSize), or io.EOF after the last. The slice is the caller's: a prefetcher
// keeps it instead of copying it once more.
func (r *Reader) Next() ([]byte, error) {
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
	r.done = true
	return nil
}

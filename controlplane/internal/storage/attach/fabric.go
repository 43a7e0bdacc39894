package attach

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach/attachdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objpath"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/alloctask"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// ObjectInfo is one object's metadata as the fabric returns it.
type ObjectInfo struct {
	Path        string
	Size        int64
	ETag        string
	ContentType string
	UpdatedAt   time.Time
}

// ObjectPage is one page of a listing.
type ObjectPage struct {
	Objects  []ObjectInfo
	Prefixes []string
	// Next is the opaque cursor of the next page; "" on the last.
	Next string
}

// Writer is who a write through an attachment is made for: the user who attached the
// bucket, on behalf of the node (audit rows of the object store name them).
type Writer struct {
	UserID       uuid.UUID
	NodeID       uuid.UUID
	AttachmentID uuid.UUID
	TenantID     uuid.UUID
	ProjectID    uuid.UUID
}

// Objects is the object store as the fabric server uses it (objects.Store behind an
// adapter: ObjectAccess). The bucket is authorised already (the attachment). Its errors
// are the contract's (storage_object_not_found, storage_quota_exceeded, ...).
type Objects interface {
	List(ctx context.Context, b Bucket, prefix, delimiter, cursor string, limit int) (ObjectPage, error)
	Stat(ctx context.Context, b Bucket, path string) (ObjectInfo, error)
	Open(ctx context.Context, b Bucket, path string, off, n int64) (io.ReadCloser, ObjectInfo, error)
	Put(ctx context.Context, b Bucket, path string, r io.Reader, size int64, contentType string, w Writer) (ObjectInfo, error)
	Delete(ctx context.Context, b Bucket, path string, w Writer) error
}

// NodeOf is the authenticated node of a fabric gRPC call (fabric.NodeID).
type NodeOf func(ctx context.Context) (uuid.UUID, bool)

// ChunkSize is the most bytes one Read message carries (the proto's 1 MiB bound).
const ChunkSize = 1 << 20

// readBuffers holds the ChunkSize buffers Read streams fill, one per live stream.
var readBuffers = sync.Pool{New: func() any { b := make([]byte, ChunkSize); return &b }}

const (
	defaultListLimit = 1000
	maxListLimit     = 1000
)

// FabricServer serves fabricv1.StorageFabric to node agents over their tunnels: every
// call names an attachment, which must be live on an allocation of the calling node
// (PERMISSION_DENIED otherwise, the same answer whether or not it exists); a rw
// attachment is needed to write or delete.
type FabricServer struct {
	fabricv1.UnimplementedStorageFabricServer
	Svc     *Service
	Objects Objects
	NodeOf  NodeOf
}

var _ fabricv1.StorageFabricServer = (*FabricServer)(nil)

// nodeAttachment is what a call may act on.
type nodeAttachment struct {
	bucket Bucket
	writer Writer
	rw     bool
}

var errDenied = status.Error(codes.PermissionDenied, "this node has no such attachment")

// attachment resolves the call's node and the named attachment; write asks for rw.
func (f *FabricServer) attachment(ctx context.Context, id string, write bool) (nodeAttachment, error) {
	nodeID, ok := f.NodeOf(ctx)
	if !ok {
		return nodeAttachment{}, status.Error(codes.Unauthenticated, "not a fabric tunnel")
	}
	aid, err := uuid.Parse(id)
	if err != nil {
		return nodeAttachment{}, errDenied
	}
	row, err := attachdb.New(db.Querier(ctx, f.Svc.Pool)).NodeAttachment(ctx, attachdb.NodeAttachmentParams{ID: aid, NodeID: nodeID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nodeAttachment{}, errDenied
	}
	if err != nil {
		return nodeAttachment{}, status.Error(codes.Unavailable, "attachment lookup failed; retry")
	}
	if write && row.Mode != alloctask.StorageModeRW {
		return nodeAttachment{}, status.Error(codes.PermissionDenied, "the attachment is read-only")
	}
	return nodeAttachment{
		bucket: Bucket{ID: row.Bucket, TenantID: row.TenantID, ProjectID: row.BucketProject, BucketID: row.BucketID},
		writer: Writer{UserID: row.CreatedBy.UUID, NodeID: nodeID, AttachmentID: row.ID, TenantID: row.TenantID, ProjectID: row.ProjectID},
		rw:     row.Mode == alloctask.StorageModeRW,
	}, nil
}

// cleanPath applies the object path rules (objpath) to a path a node sends.
func cleanPath(raw string) (string, error) {
	p, err := objpath.Clean(raw)
	if err != nil {
		return "", status.Error(codes.InvalidArgument, err.Error())
	}
	return p, nil
}

// grpcError maps the object store's contract errors onto the proto's status codes.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, "cancelled")
	}
	e, ok := apierr.As(err)
	if !ok {
		return status.Error(codes.Unavailable, "storage unavailable; retry")
	}
	switch e.Code {
	case apierr.StorageObjectNotFound:
		return status.Error(codes.NotFound, e.Message)
	case apierr.StorageQuotaExceeded:
		return status.Error(codes.ResourceExhausted, e.Message)
	case apierr.StoragePathTraversal, apierr.ValidationError, apierr.InvalidRequest:
		if e.Status == 413 {
			return status.Error(codes.ResourceExhausted, e.Message)
		}
		return status.Error(codes.InvalidArgument, e.Message)
	case apierr.StorageAlreadyExists:
		return status.Error(codes.FailedPrecondition, e.Message)
	case apierr.InsufficientPermissions:
		return status.Error(codes.PermissionDenied, e.Message)
	}
	if e.Status == 404 {
		// The bucket went away under a live attachment (force delete).
		return status.Error(codes.NotFound, e.Message)
	}
	if e.Status == 413 {
		return status.Error(codes.ResourceExhausted, e.Message)
	}
	return status.Error(codes.Unavailable, e.Message)
}

func protoInfo(o ObjectInfo) *fabricv1.StorageObjectInfo {
	return &fabricv1.StorageObjectInfo{Path: o.Path, Size: o.Size, Etag: o.ETag, UpdatedAt: timestamppb.New(o.UpdatedAt), ContentType: o.ContentType}
}

// List implements StorageFabric.List.
func (f *FabricServer) List(ctx context.Context, r *fabricv1.StorageListRequest) (*fabricv1.StorageListResponse, error) {
	a, err := f.attachment(ctx, r.GetAttachmentId(), false)
	if err != nil {
		return nil, err
	}
	prefix := r.GetPrefix()
	if prefix != "" {
		if prefix, err = objpath.CleanPrefix(prefix); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if d := r.GetDelimiter(); d != "" && d != "/" {
		return nil, status.Error(codes.InvalidArgument, `delimiter must be "" or "/"`)
	}
	limit := int(r.GetLimit())
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	pg, err := f.Objects.List(ctx, a.bucket, prefix, r.GetDelimiter(), r.GetCursor(), limit)
	if err != nil {
		return nil, grpcError(err)
	}
	out := &fabricv1.StorageListResponse{Prefixes: pg.Prefixes, NextCursor: pg.Next}
	for _, o := range pg.Objects {
		out.Entries = append(out.Entries, protoInfo(o))
	}
	return out, nil
}

// Stat implements StorageFabric.Stat.
func (f *FabricServer) Stat(ctx context.Context, r *fabricv1.StorageStatRequest) (*fabricv1.StorageObjectInfo, error) {
	a, err := f.attachment(ctx, r.GetAttachmentId(), false)
	if err != nil {
		return nil, err
	}
	p, err := cleanPath(r.GetPath())
	if err != nil {
		return nil, err
	}
	o, err := f.Objects.Stat(ctx, a.bucket, p)
	if err != nil {
		return nil, grpcError(err)
	}
	return protoInfo(o), nil
}

// openRange runs a read's checks (the attachment is the calling node's and live, the
// path is clean, the version matches) and opens [offset, offset+n) of the object; rc is
// nil when the range is empty (offset at or past the end). Both Read and the raw read
// stream (ServeRawRead) go through it, so each block a node fetches is authorised the
// same way whichever carries it.
func (f *FabricServer) openRange(ctx context.Context, r *fabricv1.StorageReadRequest) (rc io.ReadCloser, info ObjectInfo, n int64, err error) {
	a, err := f.attachment(ctx, r.GetAttachmentId(), false)
	if err != nil {
		return nil, ObjectInfo{}, 0, err
	}
	p, err := cleanPath(r.GetPath())
	if err != nil {
		return nil, ObjectInfo{}, 0, err
	}
	if r.GetOffset() < 0 {
		return nil, ObjectInfo{}, 0, status.Error(codes.InvalidArgument, "offset must be >= 0")
	}
	st, err := f.Objects.Stat(ctx, a.bucket, p)
	if err != nil {
		return nil, ObjectInfo{}, 0, grpcError(err)
	}
	if m := r.GetIfMatch(); m != "" && m != st.ETag {
		return nil, ObjectInfo{}, 0, status.Error(codes.FailedPrecondition, "the object changed")
	}
	off, n := r.GetOffset(), r.GetLength()
	if off >= st.Size {
		return nil, st, 0, nil
	}
	if n <= 0 || off+n > st.Size {
		n = st.Size - off
	}
	rc, info, err = f.Objects.Open(ctx, a.bucket, p, off, n)
	if err != nil {
		return nil, ObjectInfo{}, 0, grpcError(err)
	}
	if m := r.GetIfMatch(); m != "" && m != info.ETag {
		rc.Close()
		return nil, ObjectInfo{}, 0, status.Error(codes.FailedPrecondition, "the object changed")
	}
	return rc, info, n, nil
}

// Read implements StorageFabric.Read: the info first, then the range in chunks of at most
// ChunkSize, straight from the object store's reader (never the whole object in memory).
func (f *FabricServer) Read(r *fabricv1.StorageReadRequest, stream fabricv1.StorageFabric_ReadServer) error {
	rc, info, n, err := f.openRange(stream.Context(), r)
	if err != nil {
		return err
	}
	if rc == nil {
		return stream.Send(&fabricv1.StorageReadChunk{Info: protoInfo(info)})
	}
	defer rc.Close()
	first := &fabricv1.StorageReadChunk{Info: protoInfo(info)}
	// One buffer for the whole stream: Send encodes the message into gRPC's own
	// buffers before it returns (a stats handler's OutPayload.Payload is documented as
	// valid only during HandleRPC), so reusing it is safe, and a fresh 1 MiB buffer
	// per message was a tenth of the server's CPU for a large read (zeroing and GC).
	buf := readBuffers.Get().(*[]byte)
	defer readBuffers.Put(buf)
	for left := n; left > 0; {
		chunk := (*buf)[:min(left, ChunkSize)]
		k, rerr := io.ReadFull(rc, chunk)
		if k > 0 {
			msg := first
			if msg == nil {
				msg = &fabricv1.StorageReadChunk{}
			}
			first = nil
			msg.Data = chunk[:k]
			if err := stream.Send(msg); err != nil {
				return err
			}
			left -= int64(k)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return grpcError(rerr)
		}
	}
	if first != nil {
		return stream.Send(first)
	}
	return nil
}

// rawWriteChunk is the most bytes one write to a raw read stream carries: large writes
// keep the tunnel's per-write work (framing, records, syscalls) per byte small.
const rawWriteChunk = 256 << 10

// rawReadTimeout bounds one range on a raw read stream: a block is at most a few MiB,
// so a range still unsent after this is stuck (an agent that stopped reading).
const rawReadTimeout = 5 * time.Minute

// rawIdleTimeout is how long a raw read stream waits for its next request before the
// control plane closes it (the agent keeps idle streams for less).
const rawIdleTimeout = 30 * time.Second

// ServeRawRead serves one raw read stream (fabricnet.AgentStreamStorageRead), the
// agent's bulk path for StorageFabric.Read: the same request and the same checks
// (openRange) for every range it asks on the stream, but the bytes go from the object
// store's reader to the stream as they are, with no protobuf message, HTTP/2 frame or
// gRPC buffer in between. Each answer is a StreamReply (error_code: the gRPC code's
// name, message: the status message), then, when ok, the object's info as a frame and
// exactly the range's bytes; then the next request, until the agent closes the stream or
// leaves it idle for rawIdleTimeout. A failure after the info ends the stream: the agent
// sees fewer bytes than the info promised, never a short read taken for the object's end.
func (f *FabricServer) ServeRawRead(ctx context.Context, st net.Conn) {
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	for first := true; ; first = false {
		if !first {
			_ = st.SetDeadline(time.Now().Add(rawIdleTimeout))
		}
		var req fabricv1.StorageReadRequest
		if err := fabricnet.ReadFrame(st, &req); err != nil {
			return
		}
		_ = st.SetDeadline(time.Now().Add(rawReadTimeout))
		if ctx.Err() != nil || !f.serveRawRange(ctx, st, &req) {
			return
		}
	}
}

// serveRawRange answers one request on a raw read stream; false: the stream is done for.
func (f *FabricServer) serveRawRange(ctx context.Context, st net.Conn, req *fabricv1.StorageReadRequest) bool {
	rc, info, n, err := f.openRange(ctx, req)
	if err != nil {
		s := status.Convert(err)
		return fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: false, ErrorCode: s.Code().String(), Message: s.Message()}) == nil
	}
	if rc != nil {
		defer rc.Close()
	}
	if fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: true}) != nil || fabricnet.WriteFrame(st, protoInfo(info)) != nil {
		return false
	}
	if rc == nil {
		return true
	}
	buf := readBuffers.Get().(*[]byte)
	defer readBuffers.Put(buf)
	for left := n; left > 0; {
		k, rerr := io.ReadFull(rc, (*buf)[:min(left, rawWriteChunk)])
		if k > 0 {
			if _, err := st.Write((*buf)[:k]); err != nil {
				return false
			}
			left -= int64(k)
		}
		if rerr != nil && left > 0 {
			return false // short: the agent sees fewer bytes than promised
		}
	}
	return true
}

// writeStream is a Write call's data messages as an io.Reader.
type writeStream struct {
	stream fabricv1.StorageFabric_WriteServer
	buf    []byte
	done   bool
}

func (w *writeStream) Read(p []byte) (int, error) {
	for len(w.buf) == 0 {
		if w.done {
			return 0, io.EOF
		}
		m, err := w.stream.Recv()
		if err == io.EOF {
			// The client closed its send side after the last byte: the content is complete.
			w.done = true
			return 0, io.EOF
		}
		if err != nil {
			// Cancelled or the tunnel went: the object store must not commit.
			return 0, err
		}
		if m.GetHeader() != nil {
			return 0, status.Error(codes.InvalidArgument, "only the first message may be a header")
		}
		w.buf = m.GetData()
	}
	k := copy(p, w.buf)
	w.buf = w.buf[k:]
	return k, nil
}

// Write implements StorageFabric.Write: the header, then the content streamed into the
// object store, which commits only on a complete body (and a known size matched).
func (f *FabricServer) Write(stream fabricv1.StorageFabric_WriteServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "the first message must be the header")
	}
	a, err := f.attachment(ctx, h.GetAttachmentId(), true)
	if err != nil {
		return err
	}
	p, err := cleanPath(h.GetPath())
	if err != nil {
		return err
	}
	size := h.GetSize()
	if size < -1 {
		return status.Error(codes.InvalidArgument, "size must be -1 or >= 0")
	}
	o, err := f.Objects.Put(ctx, a.bucket, p, &writeStream{stream: stream}, size, h.GetContentType(), a.writer)
	if err != nil {
		return grpcError(err)
	}
	return stream.SendAndClose(protoInfo(o))
}

// Delete implements StorageFabric.Delete.
func (f *FabricServer) Delete(ctx context.Context, r *fabricv1.StorageDeleteRequest) (*fabricv1.StorageDeleteResponse, error) {
	a, err := f.attachment(ctx, r.GetAttachmentId(), true)
	if err != nil {
		return nil, err
	}
	p, err := cleanPath(r.GetPath())
	if err != nil {
		return nil, err
	}
	if err := f.Objects.Delete(ctx, a.bucket, p, a.writer); err != nil {
		return nil, grpcError(err)
	}
	return &fabricv1.StorageDeleteResponse{}, nil
}

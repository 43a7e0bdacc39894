package storagemount

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// memStore is a test double of the control plane's StorageFabric service: the real one
// (controlplane/internal/storage/attach) is tested end to end through the control plane;
// here the agent side is exercised against a real gRPC server with the same contract:
// attachment checks, ro refusal, paths, chunking, if_match, quota.
type memStore struct {
	fabricv1.UnimplementedStorageFabricServer

	mu          sync.Mutex
	objects     map[string]*memObject
	attachments map[string]bool // attachment id -> rw
	quota       int64           // bytes; 0 = unlimited
	reads       []readReq
	rawReads    int // reads served over raw streams (raw_test.go)
	rawStreams  int // raw streams opened
	sideStreams int // of them, on bulk side sessions
	breakReads  int // break this many read streams after their first chunk (UNAVAILABLE)
	writes      int
	// readsLive is the number of Read streams being served; readsPeak its highest.
	readsLive, readsPeak int
}

type memObject struct {
	data    []byte
	synth   int64 // > 0: synthetic content of this size (see synthByte), data unused
	etag    string
	updated time.Time
}

type readReq struct{ off, length int64 }

func newMemStore() *memStore {
	return &memStore{objects: map[string]*memObject{}, attachments: map[string]bool{}}
}

func etagOf(b []byte) string {
	s := sha256.Sum256(b)
	return `"` + hex.EncodeToString(s[:]) + `"`
}

// synthByte is the content of synthetic objects: large test files without holding them
// in the test's memory.
func synthByte(i int64) byte { return byte((i * 131) ^ (i >> 11)) }

func synthFill(p []byte, off int64) {
	for i := range p {
		p[i] = synthByte(off + int64(i))
	}
}

type synthReader struct{ off, size int64 }

func (r *synthReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.size-r.off)
	synthFill(p[:n], r.off)
	r.off += n
	return int(n), nil
}

func (s *memStore) put(p string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objects[p] = &memObject{data: append([]byte(nil), data...), etag: etagOf(data), updated: time.Now().Add(-time.Hour).Truncate(time.Second)}
}

func (s *memStore) putSynthetic(p string, size int64) string {
	h := sha256.New()
	_, _ = io.Copy(h, &synthReader{size: size})
	etag := `"` + hex.EncodeToString(h.Sum(nil)) + `"`
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objects[p] = &memObject{synth: size, etag: etag, updated: time.Now().Add(-time.Hour).Truncate(time.Second)}
	return etag
}

func (s *memStore) get(p string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[p]
	if !ok {
		return nil, false
	}
	return append([]byte(nil), o.data...), true
}

func (s *memStore) paths() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.objects))
	for p := range s.objects {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func (o *memObject) size() int64 {
	if o.synth > 0 {
		return o.synth
	}
	return int64(len(o.data))
}

func (o *memObject) info(p string) *fabricv1.StorageObjectInfo {
	return &fabricv1.StorageObjectInfo{Path: p, Size: o.size(), Etag: o.etag, UpdatedAt: timestamppb.New(o.updated)}
}

func (s *memStore) check(att string, write bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rw, ok := s.attachments[att]
	if !ok {
		return status.Error(codes.PermissionDenied, "attachment not on this node")
	}
	if write && !rw {
		return status.Error(codes.PermissionDenied, "read-only attachment")
	}
	return nil
}

func checkPath(p string) error {
	if p == "" || len(p) > 1024 || strings.HasPrefix(p, "/") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") || strings.ContainsAny(p, "\\\x00") {
		return status.Error(codes.InvalidArgument, "storage_path_traversal")
	}
	return nil
}

func (s *memStore) List(ctx context.Context, r *fabricv1.StorageListRequest) (*fabricv1.StorageListResponse, error) {
	if err := s.check(r.GetAttachmentId(), false); err != nil {
		return nil, err
	}
	limit := int(r.GetLimit())
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.objects))
	for p := range s.objects {
		keys = append(keys, p)
	}
	sort.Strings(keys)
	out := &fabricv1.StorageListResponse{}
	cursor, n := r.GetCursor(), 0
	for _, k := range keys {
		if !strings.HasPrefix(k, r.GetPrefix()) || (cursor != "" && (k <= cursor || (strings.HasSuffix(cursor, "/") && strings.HasPrefix(k, cursor)))) {
			continue
		}
		if n == limit {
			out.NextCursor = cursor
			return out, nil
		}
		rest := strings.TrimPrefix(k, r.GetPrefix())
		if first, _, deeper := strings.Cut(rest, "/"); deeper && r.GetDelimiter() == "/" {
			cp := r.GetPrefix() + first + "/"
			out.Prefixes = append(out.Prefixes, cp)
			cursor = cp
		} else {
			out.Entries = append(out.Entries, s.objects[k].info(k))
			cursor = k
		}
		n++
	}
	return out, nil
}

func (s *memStore) Stat(ctx context.Context, r *fabricv1.StorageStatRequest) (*fabricv1.StorageObjectInfo, error) {
	if err := s.check(r.GetAttachmentId(), false); err != nil {
		return nil, err
	}
	if err := checkPath(r.GetPath()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[r.GetPath()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no such object")
	}
	return o.info(r.GetPath()), nil
}

func (s *memStore) Read(r *fabricv1.StorageReadRequest, st fabricv1.StorageFabric_ReadServer) error {
	if err := s.check(r.GetAttachmentId(), false); err != nil {
		return err
	}
	if err := checkPath(r.GetPath()); err != nil {
		return err
	}
	s.mu.Lock()
	o, ok := s.objects[r.GetPath()]
	s.reads = append(s.reads, readReq{r.GetOffset(), r.GetLength()})
	brk := s.breakReads > 0
	if brk {
		s.breakReads--
	}
	s.readsLive++
	s.readsPeak = max(s.readsPeak, s.readsLive)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.readsLive--
		s.mu.Unlock()
	}()
	if !ok {
		return status.Error(codes.NotFound, "no such object")
	}
	if r.GetIfMatch() != "" && r.GetIfMatch() != o.etag {
		return status.Error(codes.FailedPrecondition, "etag changed")
	}
	size := o.size()
	off := min(max(r.GetOffset(), 0), size)
	end := size
	if r.GetLength() > 0 {
		end = min(size, off+r.GetLength())
	}
	first := true
	buf := make([]byte, ChunkSize)
	for first || off < end {
		n := min(int64(ChunkSize), end-off)
		chunk := buf[:n]
		if o.synth > 0 {
			synthFill(chunk, off)
		} else {
			copy(chunk, o.data[off:off+n])
		}
		m := &fabricv1.StorageReadChunk{Data: chunk}
		if first {
			m.Info = o.info(r.GetPath())
		}
		if err := st.Send(m); err != nil {
			return err
		}
		off += n
		if first && brk && off < end {
			return status.Error(codes.Unavailable, "tunnel lost (test)")
		}
		first = false
	}
	return nil
}

func (s *memStore) Write(st fabricv1.StorageFabric_WriteServer) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	h := m.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "first message must be the header")
	}
	if err := s.check(h.GetAttachmentId(), true); err != nil {
		return err
	}
	if err := checkPath(h.GetPath()); err != nil {
		return err
	}
	var data []byte
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err // aborted: nothing committed
		}
		data = append(data, m.GetData()...)
		if s.overQuota(h.GetPath(), int64(len(data))) {
			return status.Error(codes.ResourceExhausted, "storage_quota_exceeded")
		}
	}
	if h.GetSize() >= 0 && int64(len(data)) != h.GetSize() {
		return status.Error(codes.InvalidArgument, "size mismatch")
	}
	s.mu.Lock()
	o := &memObject{data: data, etag: etagOf(data), updated: time.Now()}
	s.objects[h.GetPath()] = o
	s.writes++
	s.mu.Unlock()
	return st.SendAndClose(o.info(h.GetPath()))
}

func (s *memStore) overQuota(p string, n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quota == 0 {
		return false
	}
	used := n
	for k, o := range s.objects {
		if k != p {
			used += o.size()
		}
	}
	return used > s.quota
}

func (s *memStore) Delete(ctx context.Context, r *fabricv1.StorageDeleteRequest) (*fabricv1.StorageDeleteResponse, error) {
	if err := s.check(r.GetAttachmentId(), true); err != nil {
		return nil, err
	}
	if err := checkPath(r.GetPath()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.objects[r.GetPath()]; !ok {
		return nil, status.Error(codes.NotFound, "no such object")
	}
	delete(s.objects, r.GetPath())
	return &fabricv1.StorageDeleteResponse{}, nil
}

// serve starts a gRPC server for s and returns a connection to it (closed at cleanup).
func (s *memStore) serve(t testing.TB) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fabricv1.RegisterStorageFabricServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
	})
	return cc
}

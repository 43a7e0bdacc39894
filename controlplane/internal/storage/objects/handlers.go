package objects

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objpath"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is the object operations' slice of the strict server. The request chain has
// already authorised the caller (authz.ProjectRoleOrGrant: a role in the owner project
// named by X-Project-ID, or a grant on this bucket) before any of these runs and before
// a byte of an upload's body is read; a read-only caller never reaches PutStorageObject.
type Handlers struct {
	Store   *Store
	Buckets Buckets
	Cursors pagination.Codec
}

// Buckets is the access rule (storage.Service).
type Buckets interface {
	FromContext(ctx context.Context, bucketID string, need storage.Access) (storage.Bucket, error)
}

// NewHandlers returns the handlers over store.
func NewHandlers(store *Store, buckets Buckets, cursors pagination.Codec) *Handlers {
	return &Handlers{Store: store, Buckets: buckets, Cursors: cursors}
}

// raw is the request and response writer of an object operation, which the strict
// server does not hand to its methods: an upload needs the Content-Type, the
// Content-Length and the connection's read deadline; a download writes its own
// Content-Type and the 416's Content-Range.
type raw struct {
	w http.ResponseWriter
	r *http.Request
}

type rawKey struct{}

// StrictMiddleware puts the raw request of the object operations into their context
// (server.Deps.StrictMiddlewares).
func (h *Handlers) StrictMiddleware(f api.StrictHandlerFunc, op string) api.StrictHandlerFunc {
	switch op {
	case "PutStorageObject", "GetStorageObject", "HeadStorageObject":
	default:
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, request any) (any, error) {
		return f(context.WithValue(ctx, rawKey{}, raw{w: w, r: r}), w, r, request)
	}
}

func rawOf(ctx context.Context) (raw, error) {
	x, ok := ctx.Value(rawKey{}).(raw)
	if !ok {
		return raw{}, apierr.New(apierr.ServiceUnavailable, "object transfers are not wired on this server")
	}
	return x, nil
}

// bucket authorises the caller for need on bucket_id of the owner project named by the
// request's context (storage.Service.FromContext: role or grant; another tenant's or a
// missing bucket is 404, a read-only caller asking to write 403).
func (h *Handlers) bucket(ctx context.Context, bucketID string, need storage.Access) (Bucket, error) {
	if h == nil || h.Store == nil || h.Buckets == nil {
		return Bucket{}, apierr.New(apierr.ServiceUnavailable, "object storage is not wired on this server")
	}
	b, err := h.Buckets.FromContext(ctx, bucketID, need)
	if err != nil {
		return Bucket{}, err
	}
	return BucketOf(b), nil
}

// cleanPath applies the path rules; a traversal is counted.
func (h *Handlers) cleanPath(raw string) (string, error) {
	p, err := objpath.Clean(raw)
	return p, h.pathError("path", err)
}

func (h *Handlers) pathError(field string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, objpath.ErrTraversal):
		h.Store.Metrics.TraversalRefused()
		return apierr.New(apierr.StoragePathTraversal, "the %s escapes the bucket", field).With("field", field)
	case errors.Is(err, objpath.ErrTooLong):
		return apierr.Validation(field, "%s is longer than %d bytes", field, objpath.MaxLen).With("reason", "too_long")
	default:
		return apierr.Validation(field, "%s is empty", field).With("reason", "empty")
	}
}

func apiObject(o ObjectInfo) api.StorageObject {
	return api.StorageObject{Path: o.Path, SizeBytes: o.SizeBytes, Etag: o.ETag, ContentType: o.ContentType, UpdatedAt: o.UpdatedAt}
}

// PutStorageObject implements PUT /api/v1/storage/buckets/{bucket_id}/object.
func (h *Handlers) PutStorageObject(ctx context.Context, req api.PutStorageObjectRequestObject) (api.PutStorageObjectResponseObject, error) {
	rw, err := rawOf(ctx)
	if err != nil {
		return nil, err
	}
	b, err := h.bucket(ctx, req.BucketID, storage.ReadWrite)
	if err != nil {
		return nil, err
	}
	path, err := h.cleanPath(req.Params.Path)
	if err != nil {
		return nil, err
	}
	size := rw.r.ContentLength // -1: chunked
	body := &idleBody{r: req.Body, rc: http.NewResponseController(rw.w), idle: h.Store.Config.IdleTimeout}
	o, err := h.Store.Put(ctx, b, PutInput{Path: path, Body: body, Size: size,
		ContentType: rw.r.Header.Get("Content-Type"), Pre: preconditionsOf(rw.r.Header)})
	if err != nil {
		return nil, err
	}
	etag := o.ETag
	return api.PutStorageObject200JSONResponse{Body: apiObject(o), Headers: api.PutStorageObject200ResponseHeaders{ETag: &etag}}, nil
}

// idleBody gives each read of an upload's body its own deadline: the server's
// ReadTimeout bounds a whole request, which a large upload at an honest speed would
// pass, while a client that stops sending is still cut off after idle.
type idleBody struct {
	r    io.Reader
	rc   *http.ResponseController
	idle time.Duration
	last time.Time
}

func (b *idleBody) Read(p []byte) (int, error) {
	// Setting a deadline is cheap but not free: once a second is plenty for a timeout
	// counted in tens of seconds.
	if now := time.Now(); now.Sub(b.last) > time.Second {
		_ = b.rc.SetReadDeadline(now.Add(b.idle)) // unsupported (HTTP/2 test servers): the server's own limits apply
		b.last = now
	}
	return b.r.Read(p)
}

// DeleteStorageObject implements DELETE /api/v1/storage/buckets/{bucket_id}/object.
func (h *Handlers) DeleteStorageObject(ctx context.Context, req api.DeleteStorageObjectRequestObject) (api.DeleteStorageObjectResponseObject, error) {
	b, err := h.bucket(ctx, req.BucketID, storage.ReadWrite)
	if err != nil {
		return nil, err
	}
	path, err := h.cleanPath(req.Params.Path)
	if err != nil {
		return nil, err
	}
	ifMatch := ""
	if req.Params.IfMatch != nil {
		ifMatch = *req.Params.IfMatch
	}
	if err := h.Store.Delete(ctx, b, path, ifMatch, Actor{}); err != nil {
		return nil, err
	}
	return api.DeleteStorageObject204Response{}, nil
}

// ListStorageObjects implements GET /api/v1/storage/buckets/{bucket_id}/objects.
func (h *Handlers) ListStorageObjects(ctx context.Context, req api.ListStorageObjectsRequestObject) (api.ListStorageObjectsResponseObject, error) {
	b, err := h.bucket(ctx, req.BucketID, storage.Read)
	if err != nil {
		return nil, err
	}
	prefix := ""
	if req.Params.Prefix != nil {
		if prefix, err = objpath.CleanPrefix(*req.Params.Prefix); err != nil {
			return nil, h.pathError("prefix", err)
		}
	}
	delimiter := ""
	if req.Params.Delimiter != nil {
		delimiter = string(*req.Params.Delimiter)
	}
	sort := listSort(b, prefix, delimiter)
	var from *Position
	if req.Params.Cursor != nil {
		from = &Position{}
		if err := h.Cursors.Decode(*req.Params.Cursor, sort, from); err != nil {
			return nil, err
		}
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Store.List(ctx, b, prefix, delimiter, from, size)
	if err != nil {
		return nil, err
	}
	objects := 0
	for _, e := range pg.Entries {
		if !e.Prefix {
			objects++
		}
	}
	out := api.StorageObjectListResponse{Objects: make([]api.StorageObject, 0, objects), CommonPrefixes: make([]string, 0, len(pg.Entries)-objects),
		Pagination: api.Pagination{PageSize: size}}
	for _, e := range pg.Entries {
		if e.Prefix {
			out.CommonPrefixes = append(out.CommonPrefixes, e.Path)
		} else {
			out.Objects = append(out.Objects, apiObject(e.Object))
		}
	}
	if pg.Next != nil {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sort, pg.Next); err != nil {
			return nil, err
		}
	}
	return listAnswer{body: out}, nil
}

// listSort binds a listing cursor to its bucket, prefix and delimiter (a cursor from
// another listing is refused, not misread), in a few bytes: the cursor must also carry
// a position of up to 1024 bytes.
func listSort(b Bucket, prefix, delimiter string) string {
	sum := sha256.Sum256([]byte(b.ID.String() + "\x00" + prefix + "\x00" + delimiter))
	return "objects:" + hex.EncodeToString(sum[:8])
}

// GetStorageObject implements GET /api/v1/storage/buckets/{bucket_id}/object.
func (h *Handlers) GetStorageObject(ctx context.Context, req api.GetStorageObjectRequestObject) (api.GetStorageObjectResponseObject, error) {
	return h.serve(ctx, req.BucketID, req.Params.Path, false)
}

// HeadStorageObject implements HEAD /api/v1/storage/buckets/{bucket_id}/object.
func (h *Handlers) HeadStorageObject(ctx context.Context, req api.HeadStorageObjectRequestObject) (api.HeadStorageObjectResponseObject, error) {
	return h.serve(ctx, req.BucketID, req.Params.Path, true)
}

// serve answers GET and HEAD: conditional headers first (412, 304), then the range
// (416, 206), then the bytes of the version whose metadata the headers carry.
func (h *Handlers) serve(ctx context.Context, bucketID, rawPath string, head bool) (*objectResponse, error) {
	rw, err := rawOf(ctx)
	if err != nil {
		return nil, err
	}
	b, err := h.bucket(ctx, bucketID, storage.Read)
	if err != nil {
		return nil, err
	}
	path, err := h.cleanPath(rawPath)
	if err != nil {
		return nil, err
	}
	pre := preconditionsOf(rw.r.Header)
	for attempt := 0; ; attempt++ {
		o, err := h.Store.Stat(ctx, b, path)
		if err != nil {
			return nil, err
		}
		resp := &objectResponse{o: o, status: http.StatusOK, n: o.SizeBytes}
		switch pre.evaluate(true, o.ETag, o.UpdatedAt, true) {
		case preconditionFailed:
			rw.w.Header().Set("ETag", o.ETag)
			return nil, errPreconditionFailed()
		case notModified:
			resp.status = http.StatusNotModified
			return resp, nil
		}
		if rh := rw.r.Header.Get("Range"); rh != "" && pre.rangeApplies(o.ETag, o.UpdatedAt) {
			r, ok, err := parseRange(rh, o.SizeBytes)
			if err != nil {
				rw.w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(o.SizeBytes, 10))
				return nil, err
			}
			if ok {
				resp.status, resp.off, resp.n, resp.partial = http.StatusPartialContent, r.Off, r.N, true
			}
		}
		if head {
			return resp, nil
		}
		body, err := h.Store.Blob.Open(ctx, o.blobKey, resp.off, resp.n)
		if errors.Is(err, blob.ErrNotFound) && attempt == 0 {
			continue // replaced (or deleted) since the row was read: read it again
		}
		if errors.Is(err, blob.ErrNotFound) {
			return nil, errNotFound(path)
		}
		if err != nil {
			return nil, fmt.Errorf("open object bytes: %w", err)
		}
		resp.body = body
		resp.rc = http.NewResponseController(rw.w)
		resp.idle = h.Store.Config.IdleTimeout
		resp.metrics = h.Store.Metrics
		return resp, nil
	}
}

// objectResponse is the answer of GET and HEAD. It writes the object's own Content-Type
// (the generated responses can only say application/octet-stream) and streams the body
// through a 1 MiB buffer, giving each write to the client its own deadline.
type objectResponse struct {
	o       ObjectInfo
	status  int
	off, n  int64
	partial bool
	body    io.ReadCloser
	rc      *http.ResponseController
	idle    time.Duration
	metrics Metrics
}

func (r *objectResponse) VisitGetStorageObjectResponse(w http.ResponseWriter) error {
	return r.write(w)
}

func (r *objectResponse) VisitHeadStorageObjectResponse(w http.ResponseWriter) error {
	return r.write(w)
}

func (r *objectResponse) write(w http.ResponseWriter) error {
	h := w.Header()
	h.Set("ETag", r.o.ETag)
	h.Set("Last-Modified", r.o.UpdatedAt.UTC().Format(http.TimeFormat))
	if r.status == http.StatusNotModified {
		w.WriteHeader(r.status)
		return nil
	}
	h.Set("Content-Type", r.o.ContentType)
	h.Set("Accept-Ranges", "bytes")
	h.Set("Content-Length", strconv.FormatInt(r.n, 10))
	if r.partial {
		h.Set("Content-Range", contentRange(byteRange{Off: r.off, N: r.n}, r.o.SizeBytes))
	}
	w.WriteHeader(r.status)
	if r.body == nil {
		return nil
	}
	defer r.body.Close()
	var n int64
	var err error
	fs, isFile := r.body.(blob.FileSection)
	rf, canSend := readerFrom(w)
	if isFile && canSend {
		n, err = r.sendFile(rf, fs)
	} else {
		n, err = copyOut(&deadlineWriter{w: w, rc: r.rc, idle: r.idle}, r.body)
	}
	r.metrics.BytesOut(n)
	if err != nil {
		// The status line is gone; all that is left is to cut the response short, which
		// the client sees as a body shorter than its Content-Length.
		panic(http.ErrAbortHandler)
	}
	return nil
}

// sendChunk is how much of a file one sendfile call may send: each chunk gets the
// rolling write deadline, like one buffer of copyOut (a client must take this much within
// the idle timeout), and a 1 GiB download takes 256 calls.
const sendChunk = 4 << 20

// sendFile sends the object's file section through rf, the connection's own ReadFrom,
// which hands an *os.File behind an io.LimitedReader to sendfile(2): the bytes go from
// the page cache to the socket without passing through this process, where copyOut
// reads each megabyte into a buffer and writes it out again.
func (r *objectResponse) sendFile(rf io.ReaderFrom, fs blob.FileSection) (int64, error) {
	f, off, left := fs.FileSection()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	var sent int64
	var last time.Time
	for left > 0 {
		if now := time.Now(); now.Sub(last) > time.Second {
			_ = r.rc.SetWriteDeadline(now.Add(r.idle))
			last = now
		}
		n, err := rf.ReadFrom(&io.LimitedReader{R: f, N: min(left, sendChunk)})
		sent, left = sent+n, left-n
		if err != nil {
			return sent, err
		}
		if n == 0 {
			return sent, io.ErrUnexpectedEOF // the file is shorter than its row says
		}
	}
	return sent, nil
}

// readerFrom finds the connection's io.ReaderFrom under the middleware's wrappers
// (each exposes Unwrap, the http.ResponseController convention). The wrappers only
// watch the status line, which WriteHeader has already passed through them, so the
// body may bypass them.
func readerFrom(w http.ResponseWriter) (io.ReaderFrom, bool) {
	for {
		if rf, ok := w.(io.ReaderFrom); ok {
			return rf, true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil, false
		}
		w = u.Unwrap()
	}
}

// copyOut streams src to dst through a 1 MiB buffer (blob.Copy).
func copyOut(dst io.Writer, src io.Reader) (int64, error) { return blob.Copy(dst, src) }

// deadlineWriter gives the writes of a download a rolling deadline: a client that
// stops reading is cut off after idle, one that reads slowly is not.
type deadlineWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
	last time.Time
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	if now := time.Now(); now.Sub(d.last) > time.Second {
		_ = d.rc.SetWriteDeadline(now.Add(d.idle))
		d.last = now
	}
	return d.w.Write(p)
}

package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3PartSize is the multipart part size: an upload of unknown length holds one part in
// memory at a time, so this bounds an upload's memory, and 10,000 parts of it allow
// objects up to ~156 GiB.
const S3PartSize = 16 << 20

// cleanupTimeout bounds the clean-up after a failed Put, which runs even when the
// request's context has ended (that is often why it failed).
const cleanupTimeout = time.Minute

// S3 stores objects in one bucket of an S3-compatible server.
type S3 struct {
	client *minio.Client
	core   minio.Core
	bucket string
}

var _ Driver = (*S3)(nil)
var _ Inventory = (*S3)(nil)
var _ TempSweeper = (*S3)(nil)

// NewS3 builds the driver. It does not contact the server: call Check at startup.
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("blob: s3 driver needs GANTRY_STORAGE_S3_ENDPOINT and GANTRY_STORAGE_S3_BUCKET")
	}
	host, secure, err := parseEndpoint(cfg.Endpoint, cfg.Insecure)
	if err != nil {
		return nil, err
	}
	client, err := minio.New(host, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: secure,
		Region: cfg.Region,
	})
	if err != nil {
		return nil, fmt.Errorf("blob: s3 client: %w", err)
	}
	return &S3{client: client, core: minio.Core{Client: client}, bucket: cfg.Bucket}, nil
}

// parseEndpoint accepts "host:port" (TLS unless insecure) or a URL whose scheme decides.
func parseEndpoint(endpoint string, insecure bool) (host string, secure bool, err error) {
	if !strings.Contains(endpoint, "://") {
		return endpoint, !insecure, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || (u.Scheme != "http" && u.Scheme != "https") {
		return "", false, fmt.Errorf("blob: GANTRY_STORAGE_S3_ENDPOINT %q: want host:port or http(s)://host[:port]", endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

func (d *S3) Name() string { return "s3" }

// Bucket is the S3 bucket the driver writes to.
func (d *S3) Bucket() string { return d.bucket }

func (d *S3) Close() error { return nil }

// Check reports whether the server answers and the bucket exists: a missing bucket would
// otherwise look like a store where every object is not found.
func (d *S3) Check(ctx context.Context) error {
	ok, err := d.client.BucketExists(ctx, d.bucket)
	if err != nil {
		return fmt.Errorf("blob: s3 bucket %s: %w", d.bucket, err)
	}
	if !ok {
		return fmt.Errorf("blob: s3 bucket %s does not exist", d.bucket)
	}
	return nil
}

// RemoveStaleTemps aborts multipart uploads started before cutoff (see TempSweeper).
func (d *S3) RemoveStaleTemps(ctx context.Context, cutoff time.Time) (int, error) {
	removed := 0
	for u := range d.client.ListIncompleteUploads(ctx, d.bucket, "", true) {
		if u.Err != nil {
			return removed, fmt.Errorf("blob: s3 list uploads: %w", u.Err)
		}
		if !u.Initiated.Before(cutoff) {
			continue
		}
		if err := d.core.AbortMultipartUpload(ctx, d.bucket, u.Key, u.UploadID); err != nil {
			if minio.ToErrorResponse(err).Code == "NoSuchUpload" {
				continue // finished or aborted meanwhile
			}
			return removed, fmt.Errorf("blob: s3 abort upload %s: %w", u.Key, err)
		}
		removed++
	}
	return removed, nil
}

func (d *S3) Put(ctx context.Context, key string, r io.Reader, size int64) (PutResult, error) {
	if err := checkKey(key); err != nil {
		return PutResult{}, err
	}
	in := newIntake(ctx, r, size)
	info, err := d.client.PutObject(ctx, d.bucket, key, in, size, minio.PutObjectOptions{
		PartSize:    S3PartSize,
		ContentType: "application/octet-stream",
	})
	if err == nil {
		err = in.done()
		if err == nil && info.Size != in.n {
			err = fmt.Errorf("%w: server stored %d bytes of %d", ErrSizeMismatch, info.Size, in.n)
		}
		if err != nil {
			// The server committed what it was sent, but that is not what the caller
			// declared: take it back so nothing wrong stays visible.
			d.cleanup(ctx, key, true)
			return PutResult{}, err
		}
		return in.result(), nil
	}
	// minio-go aborts a failed multipart upload itself; make sure even when the abort
	// failed too, so no parts linger (they cost storage and show in Inventory).
	d.cleanup(ctx, key, false)
	if ierr := in.streamErr(); ierr != nil {
		return PutResult{}, ierr
	}
	return PutResult{}, fmt.Errorf("blob: s3 put %s: %w", key, err)
}

// cleanup removes what a failed Put may have left: unfinished multipart uploads of the
// key and, when the server committed a wrong object, the object itself. Keys are written
// once per version, so no other writer's upload of the same key can be in flight.
func (d *S3) cleanup(ctx context.Context, key string, object bool) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = d.client.RemoveIncompleteUpload(cctx, d.bucket, key)
	if object {
		_ = d.client.RemoveObject(cctx, d.bucket, key, minio.RemoveObjectOptions{})
	}
}

func (d *S3) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if off < 0 || n < -1 {
		return nil, ErrInvalidRange
	}
	if n == 0 {
		// An empty range has no HTTP spelling: check the object and the offset instead.
		return d.emptyRange(ctx, key, off)
	}
	var opts minio.GetObjectOptions
	switch {
	case n > 0:
		_ = opts.SetRange(off, off+n-1)
	case off > 0:
		_ = opts.SetRange(off, 0)
	}
	body, _, _, err := d.core.GetObject(ctx, d.bucket, key, opts)
	if err != nil {
		if minio.ToErrorResponse(err).Code == "InvalidRange" {
			// S3 answers 416 for a range starting at the end (also of an empty
			// object), where Driver promises an empty reader.
			return d.emptyRange(ctx, key, off)
		}
		return nil, d.mapErr("open", key, err)
	}
	if n > 0 {
		// The server cuts a range at the object's end; the limit guards the other side.
		return struct {
			io.Reader
			io.Closer
		}{io.LimitReader(body, n), body}, nil
	}
	return body, nil
}

func (d *S3) emptyRange(ctx context.Context, key string, off int64) (io.ReadCloser, error) {
	info, err := d.Stat(ctx, key)
	if err != nil {
		return nil, err
	}
	if _, err := span(info.Size, off, 0); err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader("")), nil
}

func (d *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, err
	}
	oi, err := d.client.StatObject(ctx, d.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, d.mapErr("stat", key, err)
	}
	return Info{Size: oi.Size}, nil
}

func (d *S3) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	err := d.client.RemoveObject(ctx, d.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && !errors.Is(d.mapErr("delete", key, err), ErrNotFound) {
		return fmt.Errorf("blob: s3 delete %s: %w", key, err)
	}
	return nil
}

func (d *S3) mapErr(op, key string, err error) error {
	resp := minio.ToErrorResponse(err)
	if resp.Code == "NoSuchKey" || (resp.StatusCode == http.StatusNotFound && resp.Code != "NoSuchBucket") {
		return ErrNotFound
	}
	return fmt.Errorf("blob: s3 %s %s: %w", op, key, err)
}

// Inventory lists the bucket's objects and, as "upload:<key>", its unfinished multipart
// uploads, sorted.
func (d *S3) Inventory(ctx context.Context) ([]string, error) {
	var names []string
	for o := range d.client.ListObjects(ctx, d.bucket, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("blob: s3 list: %w", o.Err)
		}
		names = append(names, o.Key)
	}
	for u := range d.client.ListIncompleteUploads(ctx, d.bucket, "", true) {
		if u.Err != nil {
			return nil, fmt.Errorf("blob: s3 list uploads: %w", u.Err)
		}
		names = append(names, "upload:"+u.Key)
	}
	sort.Strings(names)
	return names, nil
}

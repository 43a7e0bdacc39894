package objects

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects/objectsdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Config is the object store's settings.
type Config struct {
	// MaxObjectBytes is the per-PUT limit (GANTRY_STORAGE_MAX_OBJECT_BYTES, 5 GiB).
	MaxObjectBytes int64
	// ReserveStep is how much quota a chunked upload reserves at a time (8 MiB).
	ReserveStep int64
	// StepTimeout bounds each database step of a streamed request, which has no request
	// deadline of its own (0: 10 s).
	StepTimeout time.Duration
	// IdleTimeout is how long an upload waits for the next bytes of its body, and a
	// download for the client to take the next ones (0: 60 s).
	IdleTimeout time.Duration
	// UploadTTL is how long a reservation outlives its upload's last sign of life before
	// the storage sweeper frees it (GANTRY_STORAGE_UPLOAD_TTL, 1 h); an upload moves it
	// on as bytes arrive.
	UploadTTL time.Duration
}

// Defaults of Config.
const (
	DefaultMaxObjectBytes = 5 << 30
	DefaultReserveStep    = 8 << 20
	DefaultStepTimeout    = 10 * time.Second
	DefaultIdleTimeout    = 60 * time.Second
	DefaultUploadTTL      = time.Hour
)

func (c Config) withDefaults() Config {
	if c.MaxObjectBytes <= 0 {
		c.MaxObjectBytes = DefaultMaxObjectBytes
	}
	if c.ReserveStep <= 0 {
		c.ReserveStep = DefaultReserveStep
	}
	if c.StepTimeout <= 0 {
		c.StepTimeout = DefaultStepTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.UploadTTL <= 0 {
		c.UploadTTL = DefaultUploadTTL
	}
	return c
}

// Store is the object store: metadata in PostgreSQL, bytes in the blob driver.
type Store struct {
	Pool *pgxpool.Pool
	Blob blob.Driver
	// Limits is the platform's default quota per project.
	Limits Limits
	Clock  clock.Clock
	IDs    ids.Source
	Audit  *audit.Log
	Config Config
	Log    *slog.Logger
	// Metrics counts bytes and refusals (nil counts nothing).
	Metrics Metrics
}

// New returns a Store.
func New(pool *pgxpool.Pool, driver blob.Driver, limits Limits, clk clock.Clock, idSrc ids.Source, cfg Config, log *slog.Logger, m Metrics) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m = noMetrics{}
	}
	return &Store{Pool: pool, Blob: driver, Limits: limits, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc},
		Config: cfg.withDefaults(), Log: log, Metrics: m}
}

// step is ctx bounded for one database step.
func (s *Store) step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.Config.StepTimeout)
}

func (s *Store) read(ctx context.Context) *objectsdb.Queries {
	return objectsdb.New(db.Querier(ctx, s.Pool))
}

func info(o objectsdb.StorageObject) ObjectInfo {
	return ObjectInfo{Path: o.Path, SizeBytes: o.SizeBytes, ETag: o.Etag, ContentType: o.ContentType,
		CreatedBy: o.CreatedBy, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt, blobKey: o.BlobKey}
}

func errNotFound(path string) error {
	return apierr.New(apierr.StorageObjectNotFound, "no object at this path").With("resource", "object").With("path", path)
}

// Stat is the object at path (already cleaned) of bucket b.
func (s *Store) Stat(ctx context.Context, b Bucket, path string) (ObjectInfo, error) {
	ctx, cancel := s.step(ctx)
	defer cancel()
	o, err := s.read(ctx).GetObject(ctx, objectsdb.GetObjectParams{Bucket: b.ID, Path: path})
	if errors.Is(err, pgx.ErrNoRows) {
		return ObjectInfo{}, errNotFound(path)
	}
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("stat object: %w", err)
	}
	return info(o), nil
}

// Open returns the bytes [off, off+n) of the object at path (n = -1: to the end) with
// its metadata. The reader holds the version it opened: a PUT that replaces the object
// meanwhile does not change what it reads (its old blob is deleted only after; an open
// file of the fs driver outlives the unlink, and the S3 driver's GET is one response).
func (s *Store) Open(ctx context.Context, b Bucket, path string, off, n int64) (io.ReadCloser, ObjectInfo, error) {
	o, err := s.Stat(ctx, b, path)
	if err != nil {
		return nil, ObjectInfo{}, err
	}
	rc, err := s.Blob.Open(ctx, o.blobKey, off, n)
	if errors.Is(err, blob.ErrNotFound) {
		// Replaced and deleted between the row read and the open: read the new version.
		if o2, err2 := s.Stat(ctx, b, path); err2 == nil && o2.blobKey != o.blobKey {
			o = o2
			rc, err = s.Blob.Open(ctx, o.blobKey, off, n)
		}
	}
	if errors.Is(err, blob.ErrNotFound) {
		return nil, ObjectInfo{}, errNotFound(path) // deleted meanwhile
	}
	if err != nil {
		return nil, ObjectInfo{}, fmt.Errorf("open object %s: %w", o.blobKey, err)
	}
	return &countingReader{r: rc, count: func(n int64) { s.Metrics.BytesOut(n) }}, o, nil
}

// countingReader reports the bytes read to the metrics as they pass.
type countingReader struct {
	r     io.ReadCloser
	count func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.count(int64(n))
	}
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

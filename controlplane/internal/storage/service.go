package storage

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/storagedb"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Service is buckets, grants, quota and the access rule.
type Service struct {
	Pool   *pgxpool.Pool
	Clock  clock.Clock
	IDs    ids.Source
	Audit  *audit.Log
	Outbox *outbox.Writer
	Log    *slog.Logger
	Cfg    Config
	// Blobs deletes the bytes nothing references any more (the sweeper); nil leaves
	// them queued.
	Blobs BlobDeleter
	// Metrics counts traffic and refusals (/metrics); never nil after New.
	Metrics *Metrics
}

// BlobDeleter is the part of blob.Driver the sweeper uses: an absent key is no error.
type BlobDeleter interface {
	Delete(ctx context.Context, key string) error
}

func outboxEvent(typ string, payload map[string]any) outbox.Event {
	return outbox.Event{Type: typ, Subject: "gantry.events." + typ, Payload: payload}
}

// New returns a Service whose audit log shares clk and idSrc.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cfg Config, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{Pool: pool, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc},
		Outbox: &outbox.Writer{Clock: clk, IDs: idSrc}, Log: log, Cfg: cfg.withDefaults(), Metrics: newMetrics()}
}

// read is the queries on the request's transaction, if any, else on the pool.
func (s *Service) read(ctx context.Context) *storagedb.Queries {
	return storagedb.New(db.Querier(ctx, s.Pool))
}

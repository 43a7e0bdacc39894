package storage

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/storagedb"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Service is buckets, grants, quota and the access rule.
type Service struct {
	Pool  *pgxpool.Pool
	Clock clock.Clock
	IDs   ids.Source
	Audit *audit.Log
	Log   *slog.Logger
	Cfg   Config
}

// New returns a Service whose audit log shares clk and idSrc.
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, cfg Config, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{Pool: pool, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc}, Log: log, Cfg: cfg.withDefaults()}
}

// read is the queries on the request's transaction, if any, else on the pool.
func (s *Service) read(ctx context.Context) *storagedb.Queries {
	return storagedb.New(db.Querier(ctx, s.Pool))
}

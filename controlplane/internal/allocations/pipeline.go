package allocations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pipelined is a transaction whose Exec statements are queued and sent to PostgreSQL
// together, in one round trip, when it is flushed or with the next single-row read
// (QueryRow). A change writes several rows no later statement depends on — its status
// event, task, outbox events and audit row — and each Exec alone would cost a round
// trip: on a busy 2-core machine the round trips (a context switch each way), not the
// inserts, are most of what a create spends.
//
// Only statements whose command tag nobody reads may run through it (sqlc :exec): a
// queued Exec answers an empty tag and a nil error; the statement's error, if any, comes
// from flush, which the caller must call before the transaction goes on. An error aborts
// the transaction either way, so none is lost, only reported later.
type pipelined struct {
	pgx.Tx
	batch pgx.Batch
}

// pipeline is tx as a pipeline, and whether the caller owns it (must flush it): a
// transaction that is a pipeline already is its owner's to flush.
func pipeline(tx pgx.Tx) (*pipelined, bool) {
	if p, ok := tx.(*pipelined); ok {
		return p, false
	}
	return &pipelined{Tx: tx}, true
}

// unpipelined is tx without its pipeline, what it queued sent first: for callers that
// read what they write, or count the rows they change.
func unpipelined(ctx context.Context, tx pgx.Tx) (pgx.Tx, error) {
	p, ok := tx.(*pipelined)
	if !ok {
		return tx, nil
	}
	if err := p.flush(ctx); err != nil {
		return nil, err
	}
	return p.Tx, nil
}

// Exec queues the statement.
func (p *pipelined) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	p.batch.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// flush sends the queued statements in one round trip and returns the first error.
func (p *pipelined) flush(ctx context.Context) error {
	if p.batch.Len() == 0 {
		return nil
	}
	br, err := p.send(ctx, nil)
	if err != nil {
		return err
	}
	return br.Close()
}

// send sends the queued statements, with last at the end when it is not nil, and reads
// the queued ones' results: last's, if any, are the caller's to read, then it must close
// the batch.
func (p *pipelined) send(ctx context.Context, last *pgx.QueuedQuery) (pgx.BatchResults, error) {
	n := p.batch.Len()
	b := p.batch
	p.batch = pgx.Batch{}
	if last != nil {
		b.QueuedQueries = append(b.QueuedQueries, last)
	}
	br := p.Tx.SendBatch(ctx, &b)
	for i := range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("pipelined statement %d of %d: %w", i+1, n, err)
		}
	}
	return br, nil
}

// QueryRow sends what is queued and the query together, in one round trip: the query
// sees every write queued before it, and fails if one of them failed.
func (p *pipelined) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if p.batch.Len() == 0 {
		return p.Tx.QueryRow(ctx, sql, args...)
	}
	br, err := p.send(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	if err != nil {
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// Query sends what is queued first (a round trip of its own).
func (p *pipelined) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.flush(ctx); err != nil {
		return nil, err
	}
	return p.Tx.Query(ctx, sql, args...)
}

// batchRow is the last row of a batch: scanning it ends the batch.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// SendBatch sends what is queued first.
func (p *pipelined) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := p.flush(ctx); err != nil {
		return errBatch{err: err}
	}
	return p.Tx.SendBatch(ctx, b)
}

// CopyFrom sends what is queued first.
func (p *pipelined) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := p.flush(ctx); err != nil {
		return 0, err
	}
	return p.Tx.CopyFrom(ctx, table, cols, src)
}

// Begin (a savepoint), Commit and Rollback are not for a pipeline: its owner flushes it
// and goes on with the transaction it wraps.
func (p *pipelined) Begin(context.Context) (pgx.Tx, error) {
	return nil, fmt.Errorf("allocations: savepoint inside a pipeline")
}

func (p *pipelined) Commit(context.Context) error {
	return fmt.Errorf("allocations: commit of a pipeline")
}

func (p *pipelined) Rollback(context.Context) error {
	return fmt.Errorf("allocations: rollback of a pipeline")
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch answers err for every statement of a batch that was not sent.
type errBatch struct {
	pgx.BatchResults
	err error
}

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Close() error                     { return b.err }

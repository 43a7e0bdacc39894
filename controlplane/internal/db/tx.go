package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

type txKey struct{}

// WithTx returns ctx carrying an ambient transaction: the idempotency layer opens one per
// create request so that the key row and the mutation commit together.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFrom is the ambient transaction of ctx, if any.
func TxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// InTx runs fn in a transaction and commits when fn returns nil. When ctx carries an
// ambient transaction, fn runs in a savepoint of it instead and the owner of the ambient
// transaction decides the final commit.
func InTx(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) (err error) {
	var tx pgx.Tx
	if outer, ok := TxFrom(ctx); ok {
		tx, err = outer.Begin(ctx)
	} else {
		tx, err = pool.Begin(ctx)
	}
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			Rollback(ctx, tx)
			panic(p)
		}
		if err != nil {
			Rollback(ctx, tx)
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	if err = tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// RollbackTimeout bounds a rollback. A rollback must outlive the request's deadline (it
// often runs because that deadline passed), but not a frozen database: when it times
// out, pgx closes the connection and the server aborts the transaction when it sees the
// connection gone, so nothing half-written commits either way.
const RollbackTimeout = 5 * time.Second

// Rollback rolls tx back on a context that ignores ctx's cancellation but not for
// longer than RollbackTimeout. Its error is not interesting: the transaction is over
// either way.
func Rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// Querier is what sqlc-generated packages accept: the ambient transaction when there is
// one, else the pool. Reads outside InTx use it so they see the request's own writes.
func Querier(ctx context.Context, pool *pgxpool.Pool) interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
} {
	if tx, ok := TxFrom(ctx); ok {
		return tx
	}
	return pool
}

// IsUniqueViolation reports whether err is a unique-constraint violation, optionally of
// one named constraint.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	return constraint == "" || pgErr.ConstraintName == constraint
}

package db

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultConnectTimeout bounds one connection attempt of a pool (TCP connect, TLS and
// the start-up exchange) when neither the URL's connect_timeout nor the configuration
// names one.
const DefaultConnectTimeout = 5 * time.Second

// SetConnectTimeout bounds every new connection of the pool. pgxpool creates a
// connection detached from the request that asked for it, so a database that accepts
// TCP but never answers (a frozen server: the kernel still completes the handshake)
// would otherwise hold a pool slot for ever, and a few such attempts exhaust the pool.
// A connect_timeout given in the URL wins.
func SetConnectTimeout(cfg *pgxpool.Config, d time.Duration) {
	if d <= 0 {
		d = DefaultConnectTimeout
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = d
	}
}

// IsUnavailable reports whether err means the database could not be used, as opposed
// to a query that the database refused: it could not be reached (connection refused or
// reset, a failed connection attempt), it went away mid-conversation, it is shutting
// down or starting, it has no connection slot left, or it did not answer before the
// deadline (the request's, the pool's acquire wait, or a statement timeout). The server
// answers these 503 service_unavailable with Retry-After, never 500 internal_error.
//
// A bare context error or net error is unavailability too: the database is the only
// dependency most handlers wait on. The server's error mapper only believes them for an
// answer that would otherwise be a 5xx, or when the request's own deadline has passed
// (IsUnavailable cannot tell where a net error came from; a 4xx built from one, such as
// an unreachable node probe target, stays what it is).
func IsUnavailable(err error) bool {
	return IsDatabaseUnavailable(err) || isTransportFailure(err)
}

// IsDatabaseUnavailable is the part of IsUnavailable that only the database driver
// produces, so it may override any answer: an error chain that holds one of these
// decided nothing about the request (a bearer check that could not load a key, a
// project check that could not read the membership).
func IsDatabaseUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return unavailableState(pgErr.Code)
	}
	// A connection the driver closed (a query interrupted by a deadline closes it) or a
	// timeout inside the driver.
	return errors.Is(err, pgconn.ErrConnClosed) || pgconn.Timeout(err)
}

// unavailableState is the SQLSTATEs that say "not now" rather than "no": class 08
// (connection exception), class 53 (insufficient resources, e.g. 53300
// too_many_connections), 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now, 57014 query_canceled (a statement timeout or a cancel request
// sent because a deadline passed).
func unavailableState(code string) bool {
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"):
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", "57014":
		return true
	}
	return false
}

func isTransportFailure(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}

package server

import (
	"context"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
)

// DefaultRequestTimeout is the deadline of a request when Deps.RequestTimeout is zero
// (GANTRY_REQUEST_TIMEOUT): well under the patience of a client or a load balancer
// (30-60 s), and far above any operation's normal duration, so that a frozen database
// answers 503 while the client still listens instead of holding the request for the
// whole outage.
const DefaultRequestTimeout = 10 * time.Second

// deadlines gives every operation its deadline. Every query inherits it through the
// request's context (pgx interrupts a query whose context ends, closing the
// connection, and the server then rolls the transaction back), so a request cannot
// outlive it by more than the error write. The operations that upgrade to a WebSocket
// (they answer 101: /ws/notifications, /ws/terminal, the replicas' terminal relay)
// get none: their request lives as long as the session, and they bound their own
// handshake and sends. Nor do the operations that stream raw bytes (contract.Op.Streams:
// object uploads and downloads), whose length is the client's: they bound each database
// step and each wait for the client themselves.
type deadlines struct {
	timeout   time.Duration
	streaming map[*contract.Op]bool
}

func newDeadlines(c *contract.Contract, timeout time.Duration) deadlines {
	if timeout == 0 {
		timeout = DefaultRequestTimeout
	}
	d := deadlines{timeout: timeout, streaming: map[*contract.Op]bool{}}
	for path, item := range c.Doc.Paths.Map() {
		for method, op := range item.Operations() {
			o := c.Op(method, path)
			if o != nil && (o.Streams || (op.Responses != nil && op.Responses.Value("101") != nil)) {
				d.streaming[o] = true
			}
		}
	}
	return d
}

// apply returns ctx with op's deadline; a negative timeout turns deadlines off.
func (d deadlines) apply(ctx context.Context, op *contract.Op) (context.Context, context.CancelFunc) {
	if d.timeout < 0 || d.streaming[op] {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d.timeout)
}

package fabricnet

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
)

// errServerBusy refuses a QUIC connection attempt over the handshake bound; quic-go
// answers it with CONNECTION_REFUSED.
var errServerBusy = errors.New("fabricnet: too many handshakes in progress")

// handshakeGate bounds the QUIC handshakes in progress on a listener. It is quic-go's
// ConnContext hook, which runs on the first packet of an attempt, before any
// cryptography, and must not block (it runs on the listener's receive loop): an
// attempt over the bound is refused at once rather than queued. A slot is held from
// admission until the handshake completes (done, from Accept) or the attempt ends
// (its context, which quic-go cancels when the connection closes or the handshake
// fails), whichever comes first.
type handshakeGate struct {
	slots   chan struct{}
	refused atomic.Int64
}

type gateKey struct{}

// gateSlot is one admitted attempt's slot; release is idempotent.
type gateSlot struct {
	once sync.Once
	gate *handshakeGate
}

func (s *gateSlot) release() { s.once.Do(func() { <-s.gate.slots }) }

func newHandshakeGate(n int) *handshakeGate {
	return &handshakeGate{slots: make(chan struct{}, n)}
}

// admit is quic.Transport.ConnContext.
func (g *handshakeGate) admit(ctx context.Context, _ *quic.ClientInfo) (context.Context, error) {
	select {
	case g.slots <- struct{}{}:
	default:
		g.refused.Add(1)
		return nil, errServerBusy
	}
	slot := &gateSlot{gate: g}
	context.AfterFunc(ctx, slot.release)
	return context.WithValue(ctx, gateKey{}, slot), nil
}

// done releases the slot of the connection whose context is ctx (handshake complete).
func (g *handshakeGate) done(ctx context.Context) {
	if s, ok := ctx.Value(gateKey{}).(*gateSlot); ok {
		s.release()
	}
}

// inProgress is how many admitted handshakes have not completed or ended.
func (g *handshakeGate) inProgress() int { return len(g.slots) }

// ServerBusy reports whether a dial failed because the control plane refused the
// attempt while it was busy: QUIC's CONNECTION_REFUSED, sent by a listener over its
// MaxConcurrentQUICHandshakes, or by quic-go when its queue of handshakes completed but
// not yet accepted is full. The control plane is up and shedding load: an agent should
// retry after a random wait within its reconnect spread, not escalate its backoff (the
// refusal cost the server next to nothing, and a longer wait only makes the agent late
// once the storm has passed).
func ServerBusy(err error) bool {
	var te *quic.TransportError
	return errors.As(err, &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused
}

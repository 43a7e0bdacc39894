package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// The proxy speaks plain HTTP/1.1 to the app over fabric streams: every connection the
// transport dials is one STREAM_KIND_APP_PROXY stream that the node's agent connects to
// 127.0.0.1:<port> of the instance. Connections are kept alive and reused per instance
// (the pool is keyed by the URL host, which names the instance and its port), so a
// request usually costs no stream opening at all.

// appHostSuffix makes the pool key of an instance: "<instance id>.app.gantry:<port>".
const appHostSuffix = ".app.gantry"

type targetKey struct{}

// proxied is what a proxied request's context carries: where it goes, and the call to
// meter once the app answers (nil: nothing to meter).
type proxied struct {
	target Target
	call   *Call
}

func withTarget(ctx context.Context, t Target, call *Call) context.Context {
	return context.WithValue(ctx, targetKey{}, proxied{target: t, call: call})
}

func targetOf(ctx context.Context) (Target, bool) {
	rt, ok := ctx.Value(targetKey{}).(proxied)
	return rt.target, ok
}

func appHost(t Target) string {
	return fmt.Sprintf("%s%s:%d", t.InstanceID, appHostSuffix, t.Port)
}

func (s *Service) newTransport() *http.Transport {
	return &http.Transport{
		DialContext:           s.dial,
		MaxIdleConnsPerHost:   s.cfg.MaxIdlePerInstance,
		MaxIdleConns:          1024,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: s.cfg.ResponseHeaderTimeout,
		// The app's bytes are passed as they come: no transparent gunzip, no HTTP/2.
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
		Proxy:              nil,
		// Default (4 KiB) buffers: a body is copied in 32 KiB reads that bypass them, and
		// a WebSocket keeps its connection's buffers for its whole life.
	}
}

// dial opens a stream to the instance the request's context names; the address only
// keys the pool (and must agree with the target, so a pooled connection is never
// handed to another instance's request).
func (s *Service) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	t, ok := targetOf(ctx)
	if !ok || addr != appHost(t) {
		return nil, errors.New("app proxy: dial without its target")
	}
	pre := &fabricv1.StreamPreamble{
		Kind: fabricv1.StreamKind_STREAM_KIND_APP_PROXY, StreamId: uuid.New().String(),
		AllocationId: t.AllocationID.String(), AppInstanceId: t.InstanceID.String(),
		TargetPort: uint32(t.Port), CorrelationId: correlation.ID(ctx),
	}
	octx, cancel := context.WithTimeout(ctx, s.cfg.OpenTimeout)
	defer cancel()
	st, err := s.deps.Streams.OpenStream(octx, s.life, t.NodeID, pre)
	if err != nil {
		s.metrics.openFailed.Inc()
		return nil, &dialError{err: openError(octx, err)}
	}
	s.metrics.streamsOpened.Inc()
	return st, nil
}

// dialError carries the envelope of a failed open through net/http's transport.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// openError maps a failure to open the app's stream onto the contract's codes: what
// the user can act on is whether the node is there and whether the app answers.
func openError(ctx context.Context, err error) error {
	if _, ok := apierr.As(err); ok {
		return err // the relay's (replica_unreachable, or the holder's envelope)
	}
	var refused *fabricnet.StreamRefusedError
	switch {
	case errors.Is(err, fabric.ErrNodeOffline):
		return apierr.New(apierr.ServiceUnavailable, "the app instance's node is offline").
			With("reason", "node_offline").Wrap(err)
	case errors.As(err, &refused):
		return refusedError(refused.Code).Wrap(err)
	case ctx.Err() != nil:
		return apierr.New(apierr.UpstreamError, "the node did not answer in time").With("reason", "timeout").Wrap(err)
	}
	return apierr.New(apierr.UpstreamError, "the stream to the app could not be opened").Wrap(err)
}

// refusedError maps the agent's refusal. Its message is not passed on (it may carry
// host details); its code is.
func refusedError(code string) *apierr.Error {
	switch code {
	case "connect_failed":
		return apierr.New(apierr.UpstreamError, "the app is not accepting connections on its port").
			With("reason", "app_unreachable").With("agent_error_code", code)
	case "target_not_found", "app_not_running", "allocation_not_active":
		return apierr.New(apierr.ServiceUnavailable, "the app instance is not running on its node").
			With("reason", "app_instance_not_running").With("agent_error_code", code)
	}
	return apierr.New(apierr.UpstreamError, "the node refused the app stream").With("agent_error_code", code)
}

// roundTripError maps what the transport answered when no response came back.
func roundTripError(err error) error {
	var de *dialError
	if errors.As(err, &de) {
		return de.err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	msg := "the app did not answer"
	if strings.Contains(err.Error(), "timeout awaiting response headers") {
		return apierr.New(apierr.UpstreamError, "%s in time", msg).With("reason", "timeout").Wrap(err)
	}
	return apierr.New(apierr.UpstreamError, "%s", msg).With("reason", "app_connection_failed").Wrap(err)
}

// copyBuffers lends ReverseProxy its body copy buffers. Without a pool it allocates a
// fresh 32 KiB buffer for every response (a profile of small proxied GETs: 29 KiB of the
// 47 KiB allocated per request), which the garbage collector then has to chase at 200
// requests a second per client.
var copyBuffers = &bufferPool{}

// copyBufferSize is ReverseProxy's own default.
const copyBufferSize = 32 << 10

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	buf = buf[:copyBufferSize]
	b.p.Put(&buf)
}

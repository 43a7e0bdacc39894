package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/grafana/loki/pkg/push"
	"github.com/klauspost/compress/snappy"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// buffers recycles the three byte buffers a push needs (wire body, decoded batch,
// re-encoded batch), so a steady stream of pushes does not churn the heap. What the pools
// hold is bounded by the memory budget, since only budgeted requests take buffers.
type buffers struct{ wire, decoded, encoded sync.Pool }

func getBuf(p *sync.Pool) *[]byte {
	if b, ok := p.Get().(*[]byte); ok {
		return b
	}
	return new([]byte)
}

// push handles POST /loki/api/v1/push: size, token, decode, stamp, forward.
func (g *Gateway) push(w http.ResponseWriter, r *http.Request) {
	start := g.clock.Now()
	g.metrics.InFlight.Inc()
	defer func() {
		g.metrics.InFlight.Dec()
		g.metrics.PushDuration.Observe(g.clock.Now().Sub(start).Seconds())
	}()
	limit := g.cfg.MaxBytes

	// The cap is checked on the wire before a byte of the body is read.
	if r.ContentLength > int64(limit) {
		g.tooLarge(w, r)
		return
	}

	node, ok := g.authenticate(w, r)
	if !ok {
		return
	}

	format, gz, err := requestFormat(r)
	if err != nil {
		g.invalid(w, r, err)
		return
	}

	// A plain snappy block says its decoded length in its first bytes: refuse a bomb by
	// that header before allocating anything by it.
	body := bufio.NewReaderSize(r.Body, 16)
	weight := int64(limit)
	if r.ContentLength >= 0 {
		weight = r.ContentLength
	}
	if format == formatProto && !gz {
		n, err := snappyHeaderLen(body)
		switch {
		case errors.Is(err, errTooLarge) || n > limit:
			g.tooLarge(w, r)
			return
		case err != nil:
			g.invalid(w, r, err)
			return
		}
		// Decoded bytes, about as much again for the decoded structs (an entry costs ~90
		// bytes of struct per line of typically 100-200 bytes), the re-encoded batch
		// (stamping adds a label per stream) and its snappy block.
		out := n + n/16 + 4096
		weight += int64(2*n + out + snappy.MaxEncodedLen(out))
	} else {
		// Decompressed size unknown until read: budget for the worst case.
		weight += 4 * int64(limit)
	}
	weight = min(weight, g.cfg.MemoryBudget)
	if !g.acquire(w, r, weight) {
		return
	}
	defer g.budget.Release(weight)

	var (
		req     push.PushRequest
		wire    = getBuf(&g.bufs.wire)
		decoded = getBuf(&g.bufs.decoded)
	)
	defer g.bufs.wire.Put(wire)
	defer g.bufs.decoded.Put(decoded)
	switch {
	case format == formatProto && !gz:
		if r.ContentLength > 0 && int64(cap(*wire)) < r.ContentLength {
			*wire = make([]byte, 0, r.ContentLength+1) // +1: EOF is seen without growing
		}
		*wire, err = readCapped(body, *wire, limit)
		if err == nil {
			*decoded, err = decodeSnappyProto(*decoded, *wire, limit, &req)
		}
	case format == formatProto:
		var zr io.Reader
		var done func()
		if zr, done, err = gunzipCapped(&cappedReader{r: body, limit: limit}, limit); err == nil {
			*wire, err = readCapped(zr, *wire, limit)
			done()
		}
		if err == nil {
			*decoded, err = decodeSnappyProto(*decoded, *wire, limit, &req)
		}
	default:
		var in io.Reader = &cappedReader{r: body, limit: limit}
		if gz {
			var done func()
			if in, done, err = gunzipCapped(in, limit); err == nil {
				defer done()
			}
		}
		if err == nil {
			err = decodeJSON(in, &req)
		}
	}
	if err != nil {
		if errors.Is(err, errTooLarge) {
			g.tooLarge(w, r)
		} else {
			g.invalid(w, r, err)
		}
		return
	}

	if err := stamp(&req, node); err != nil {
		g.invalid(w, r, err)
		return
	}

	encoded := getBuf(&g.bufs.encoded)
	defer g.bufs.encoded.Put(encoded)
	size := req.Size()
	if cap(*encoded) < size {
		*encoded = make([]byte, size)
	}
	raw := (*encoded)[:size]
	if _, err := req.MarshalToSizedBuffer(raw); err != nil {
		g.invalid(w, r, err)
		return
	}
	if len(req.Streams) > 0 {
		if err := g.sink.Push(r.Context(), &req, raw); err != nil {
			g.forwardFailed(w, r, err)
			return
		}
	}
	g.metrics.ForwardedBytes.Add(float64(len(raw)))
	g.count(Accepted)
	w.WriteHeader(http.StatusNoContent)
}

// authenticate reads the bearer token and asks the (cached) introspector whose it is.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	h := r.Header.Get("Authorization")
	token, found := strings.CutPrefix(h, "Bearer ")
	if !found || token == "" {
		g.count(RejectedAuth)
		g.errs.Write(w, r, apierr.New(apierr.TokenMissing, "a node bearer token is required"))
		return uuid.Nil, false
	}
	if len(token) > 512 {
		g.count(RejectedAuth)
		g.errs.Write(w, r, apierr.New(apierr.TokenInvalid, "the node token is not valid"))
		return uuid.Nil, false
	}
	node, err := g.auth.Introspect(r.Context(), token)
	switch {
	case err == nil:
		return node, true
	case errors.Is(err, ErrUnauthenticated):
		g.count(RejectedAuth)
		g.log.WarnContext(r.Context(), "node token refused", "remote", r.RemoteAddr)
		g.errs.Write(w, r, apierr.New(apierr.TokenInvalid, "the node token is not valid"))
	default:
		// The control plane could not tell: refuse, but as retryable, never as a verdict.
		g.count(RejectedAuth)
		g.log.ErrorContext(r.Context(), "token introspection failed", "error", err)
		g.errs.Write(w, r, apierr.New(apierr.ServiceUnavailable, "node tokens cannot be checked right now").
			WithRetryAfter(5*time.Second))
	}
	return uuid.Nil, false
}

// acquire waits for weight bytes of the memory budget, at most QueueTimeout.
func (g *Gateway) acquire(w http.ResponseWriter, r *http.Request, weight int64) bool {
	if g.budget.TryAcquire(weight) {
		return true
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.QueueTimeout)
	defer cancel()
	if err := g.budget.Acquire(ctx, weight); err != nil {
		g.count(ForwardFailed)
		g.errs.Write(w, r, apierr.New(apierr.ServiceUnavailable, "the log gateway is saturated").
			WithRetryAfter(time.Second))
		return false
	}
	return true
}

// stamp sets node_id on every stream to the authenticated node, and drops node_id from
// structured metadata, so no part of a batch can name another node.
func stamp(req *push.PushRequest, node uuid.UUID) error {
	id := node.String()
	seen := make(map[string]string, 4)
	for i := range req.Streams {
		s := &req.Streams[i]
		stamped, ok := seen[s.Labels]
		if !ok {
			labels, err := ParseLabels(s.Labels)
			if err != nil {
				return err
			}
			stamped = StampNode(labels, id)
			seen[s.Labels] = stamped
		}
		s.Labels = stamped
		s.Hash = 0
		for j := range s.Entries {
			e := &s.Entries[j]
			e.Parsed = nil // only Loki's query path may set it
			if len(e.StructuredMetadata) == 0 {
				continue
			}
			md := e.StructuredMetadata[:0]
			for _, m := range e.StructuredMetadata {
				if m.Name != NodeLabel {
					md = append(md, m)
				}
			}
			e.StructuredMetadata = md
		}
	}
	return nil
}

func (g *Gateway) tooLarge(w http.ResponseWriter, r *http.Request) {
	g.count(RejectedSize)
	g.errs.Write(w, r, apierr.New(apierr.InvalidRequest, "the batch is larger than %d bytes", g.cfg.MaxBytes).
		WithStatus(http.StatusRequestEntityTooLarge).With("reason", "body_too_large"))
}

func (g *Gateway) invalid(w http.ResponseWriter, r *http.Request, err error) {
	g.metrics.Invalid.Inc()
	g.log.InfoContext(r.Context(), "malformed log batch", "error", err)
	g.errs.Write(w, r, apierr.New(apierr.InvalidRequest, "the body is not a Loki push batch").With("reason", "malformed_batch"))
}

// forwardFailed maps what Loki said: 429 passes back with Retry-After, a 400 (a batch
// Loki will never take) passes back as 400 so the node stops retrying it, anything else
// is 502. Loki's own text stays in our logs.
func (g *Gateway) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	g.count(ForwardFailed)
	var ue *UpstreamError
	if !errors.As(err, &ue) {
		ue = &UpstreamError{Cause: err}
	}
	g.log.WarnContext(r.Context(), "forward to loki failed", "status", ue.Status, "error", ue.Cause)
	switch ue.Status {
	case http.StatusTooManyRequests:
		ra := ue.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		g.errs.Write(w, r, apierr.New(apierr.RateLimitExceeded, "Loki is rate limiting; retry later").WithRetryAfter(ra))
	case http.StatusBadRequest:
		g.errs.Write(w, r, apierr.New(apierr.InvalidRequest, "Loki refused the batch").With("reason", "upstream_rejected"))
	default:
		g.errs.Write(w, r, apierr.New(apierr.UpstreamError, "the batch could not be forwarded"))
	}
}

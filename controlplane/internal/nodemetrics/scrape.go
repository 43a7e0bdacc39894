package nodemetrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// Bounds of one scrape.
const (
	// MaxBytes is the most of an agent's exposition the control plane reads (the agent
	// refuses to send more: nodeagent/agent.MaxMetricsBytes).
	MaxBytes       = 4 << 20
	DefaultTimeout = 10 * time.Second
)

// Reasons of a failed scrape (details.reason of the 503).
const (
	ReasonNodeOffline  = "node_offline"
	ReasonTimeout      = "timeout"
	ReasonAgentRefused = "agent_refused"
	ReasonTooLarge     = "too_large"
	ReasonBadMetrics   = "bad_exposition"
)

// ScrapeError is a scrape that produced no metrics.
type ScrapeError struct {
	Reason string
	Err    error
}

func (e *ScrapeError) Error() string {
	if e.Err == nil {
		return "node metrics: " + e.Reason
	}
	return "node metrics: " + e.Reason + ": " + e.Err.Error()
}

func (e *ScrapeError) Unwrap() error { return e.Err }

// Fabric is what the scraper needs of package fabric.
type Fabric interface {
	OpenStream(ctx context.Context, nodeID uuid.UUID, pre *fabricv1.StreamPreamble) (net.Conn, error)
	AllPresence(ctx context.Context) (map[uuid.UUID]fleet.Presence, error)
	ReplicaID() string
}

// Scraper reads agents' metrics through the fabric.
type Scraper struct {
	Fabric Fabric
	// NATS and SubjectPrefix reach the replica holding a tunnel (subject
	// <prefix><replica>); nil NATS: only tunnels held here can be scraped.
	NATS          *nats.Conn
	SubjectPrefix string
	Timeout       time.Duration
	Log           *slog.Logger
}

func (s *Scraper) timeout() time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return DefaultTimeout
}

// Scrape returns the node agent's exposition with a node_id label on every sample.
func (s *Scraper) Scrape(ctx context.Context, nodeID uuid.UUID) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	raw, err := s.scrapeLocal(ctx, nodeID)
	var elsewhere *fabric.NotHeldHereError
	if errors.As(err, &elsewhere) {
		raw, err = s.scrapeRemote(ctx, elsewhere.Replica, nodeID)
	}
	if err != nil {
		return nil, err
	}
	return Relabel(raw, nodeID.String())
}

// scrapeLocal opens the METRICS stream on this replica's tunnel and reads until the
// agent closes it, within ctx and MaxBytes.
func (s *Scraper) scrapeLocal(ctx context.Context, nodeID uuid.UUID) ([]byte, error) {
	pre := &fabricv1.StreamPreamble{Kind: fabricv1.StreamKind_STREAM_KIND_METRICS, StreamId: uuid.NewString()}
	st, err := s.Fabric.OpenStream(ctx, nodeID, pre)
	if err != nil {
		var elsewhere *fabric.NotHeldHereError
		var refused *fabricnet.StreamRefusedError
		switch {
		case errors.As(err, &elsewhere):
			return nil, err
		case errors.Is(err, fabric.ErrNodeOffline):
			return nil, &ScrapeError{Reason: ReasonNodeOffline}
		case errors.As(err, &refused):
			return nil, &ScrapeError{Reason: ReasonAgentRefused, Err: err}
		case ctx.Err() != nil:
			return nil, &ScrapeError{Reason: ReasonTimeout, Err: err}
		}
		return nil, &ScrapeError{Reason: ReasonNodeOffline, Err: err}
	}
	defer func() { _ = st.Close() }()
	// The read deadline is what bounds an agent that accepted the stream and then says
	// nothing (a read blocked on a net.Conn ignores ctx).
	dl, _ := ctx.Deadline()
	_ = st.SetReadDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = st.SetReadDeadline(time.Now()) })
	defer stop()
	body, err := io.ReadAll(io.LimitReader(st, MaxBytes+1))
	switch {
	case len(body) > MaxBytes:
		return nil, &ScrapeError{Reason: ReasonTooLarge}
	case err != nil:
		var ne net.Error
		if ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return nil, &ScrapeError{Reason: ReasonTimeout, Err: err}
		}
		return nil, &ScrapeError{Reason: ReasonNodeOffline, Err: err}
	}
	return body, nil
}

// Relabel parses an exposition and writes it back with node_id set on every sample (an
// agent's own node_id label, if any, is overwritten: the control plane says which node
// it scraped).
func Relabel(raw []byte, nodeID string) ([]byte, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, &ScrapeError{Reason: ReasonBadMetrics, Err: err}
	}
	names := make([]string, 0, len(mfs))
	for n := range mfs {
		names = append(names, n)
	}
	sortStrings(names)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, n := range names {
		mf := mfs[n]
		for _, m := range mf.GetMetric() {
			kept := m.Label[:0]
			for _, lp := range m.Label {
				if lp.GetName() != "node_id" {
					kept = append(kept, lp)
				}
			}
			m.Label = append(kept, &dto.LabelPair{Name: proto.String("node_id"), Value: proto.String(nodeID)})
			sortLabels(m.Label)
		}
		if err := enc.Encode(mf); err != nil {
			return nil, &ScrapeError{Reason: ReasonBadMetrics, Err: err}
		}
	}
	return buf.Bytes(), nil
}

// Remote scrapes: the request is the node id, the reply the raw exposition, or an
// empty body with the Gantry-Scrape-Error header naming the reason.
const errorHeader = "Gantry-Scrape-Error"

func (s *Scraper) subject(replica string) string { return s.SubjectPrefix + replica }

func (s *Scraper) scrapeRemote(ctx context.Context, replica string, nodeID uuid.UUID) ([]byte, error) {
	if s.NATS == nil {
		return nil, &ScrapeError{Reason: ReasonNodeOffline, Err: fmt.Errorf("tunnel held by replica %s, no NATS to reach it", replica)}
	}
	msg, err := s.NATS.RequestWithContext(ctx, s.subject(replica), []byte(nodeID.String()))
	if err != nil {
		if ctx.Err() != nil {
			return nil, &ScrapeError{Reason: ReasonTimeout, Err: err}
		}
		return nil, &ScrapeError{Reason: ReasonNodeOffline, Err: err}
	}
	if reason := msg.Header.Get(errorHeader); reason != "" {
		return nil, &ScrapeError{Reason: reason, Err: fmt.Errorf("at replica %s", replica)}
	}
	return msg.Data, nil
}

// Serve answers other replicas' scrapes of tunnels held here until ctx ends.
func (s *Scraper) Serve(ctx context.Context) error {
	if s.NATS == nil {
		return nil
	}
	sub, err := s.NATS.Subscribe(s.subject(s.Fabric.ReplicaID()), func(m *nats.Msg) {
		go s.serveRemote(ctx, m)
	})
	if err != nil {
		return fmt.Errorf("node metrics: subscribe: %w", err)
	}
	context.AfterFunc(ctx, func() { _ = sub.Unsubscribe() })
	return nil
}

func (s *Scraper) serveRemote(ctx context.Context, m *nats.Msg) {
	reply := nats.NewMsg(m.Reply)
	nodeID, err := uuid.Parse(strings.TrimSpace(string(m.Data)))
	if err != nil {
		reply.Header.Set(errorHeader, ReasonNodeOffline)
		_ = m.RespondMsg(reply)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	body, err := s.scrapeLocal(ctx, nodeID)
	var se *ScrapeError
	switch {
	case errors.As(err, &se):
		reply.Header.Set(errorHeader, se.Reason)
	case err != nil: // moved again since the asker looked: let Prometheus retry
		reply.Header.Set(errorHeader, ReasonNodeOffline)
	case int64(len(body)) > s.NATS.MaxPayload()-1024:
		reply.Header.Set(errorHeader, ReasonTooLarge)
	default:
		reply.Data = body
	}
	if err := m.RespondMsg(reply); err != nil && s.Log != nil {
		s.Log.Warn("node metrics reply failed", "node_id", nodeID, "err", err)
	}
}

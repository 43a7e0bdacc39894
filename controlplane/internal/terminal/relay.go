package terminal

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// The cross-replica hop. A terminal WebSocket may land on any replica, but only the
// replica holding the node's tunnel can open a stream to its agent. The replica with
// the browser (the edge) then asks the holder over HTTP: GET RouteRelay, upgraded to a
// WebSocket whose binary messages carry the terminal stream's bytes (termproto) both
// ways, so the edge bridges it exactly like a local stream. The holder opens the
// agent's stream before upgrading, so its refusals come back as envelopes.
//
// Replicas find each other in a JetStream KV bucket (replica id -> base URL, kept
// fresh while the replica runs). The request carries a relay token: claims (target
// replica, node, allocation, session, the preamble) and an HMAC-SHA256 under a key
// derived from the master key, valid for relayTokenTTL and once.

const (
	// RelaySubprotocol is the relay WebSocket's protocol.
	RelaySubprotocol = "gantry.terminal-relay.v1"
	relayTokenTTL    = 30 * time.Second
	relayRefresh     = 30 * time.Second
	// relayEntryTTL: a replica that stopped refreshing drops out of the directory.
	relayEntryTTL = 3 * relayRefresh
	// relayReadLimit covers one termproto frame (32 KiB + header) per message.
	relayReadLimit = 1 << 20
)

// relayDirectory is the replica -> relay URL bucket. The bucket is opened on first
// use (a replica's Run, or its first hop), so a control plane that never serves
// terminals across replicas (tests of other features) creates nothing.
type relayDirectory struct {
	js      jetstream.JetStream
	bucket  string
	replica string

	mu sync.Mutex
	kv jetstream.KeyValue
}

func newRelayDirectory(js jetstream.JetStream, bucket, replica string) *relayDirectory {
	return &relayDirectory{js: js, bucket: bucket, replica: replica}
}

func (d *relayDirectory) open(ctx context.Context) (jetstream.KeyValue, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kv != nil {
		return d.kv, nil
	}
	kv, err := d.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: d.bucket, Description: "gantry terminal relay: replica -> internal base URL", History: 1, TTL: relayEntryTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("terminal: replica bucket: %w", err)
	}
	d.kv = kv
	return kv, nil
}

type relayEntry struct {
	URL string `json:"url"`
}

func (d *relayDirectory) publish(ctx context.Context, url string) error {
	if url == "" {
		return errors.New("no relay URL")
	}
	kv, err := d.open(ctx)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(relayEntry{URL: strings.TrimRight(url, "/")})
	_, err = kv.Put(ctx, d.replica, b)
	return err
}

func (d *relayDirectory) withdraw(ctx context.Context) {
	d.mu.Lock()
	kv := d.kv
	d.mu.Unlock()
	if kv != nil {
		_ = kv.Delete(ctx, d.replica)
	}
}

func (d *relayDirectory) lookup(ctx context.Context, replica string) (string, error) {
	kv, err := d.open(ctx)
	if err != nil {
		return "", err
	}
	e, err := kv.Get(ctx, replica)
	if err != nil {
		return "", err
	}
	var v relayEntry
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.URL == "" {
		return "", fmt.Errorf("terminal: bad relay entry for %s", replica)
	}
	return v.URL, nil
}

// relayClaims is what a relay token asserts.
type relayClaims struct {
	Replica   string `json:"rep"`   // the replica that must serve it
	Node      string `json:"node"`  // node id
	Preamble  []byte `json:"pre"`   // the StreamPreamble to open (protobuf)
	Expires   int64  `json:"exp"`   // unix milliseconds
	Nonce     string `json:"nonce"` // one use
	Allocated string `json:"alloc"` // allocation id (must match the path)
}

var relayEncoding = base64.RawURLEncoding

func (s *Service) signRelay(c relayClaims) string {
	body, _ := json.Marshal(c)
	mac := hmac.New(sha256.New, s.deps.RelayKey)
	mac.Write(body)
	return relayEncoding.EncodeToString(body) + "." + relayEncoding.EncodeToString(mac.Sum(nil))
}

// verifyRelay checks a relay token's signature, target, expiry and single use.
func (s *Service) verifyRelay(tok string, allocationID uuid.UUID) (relayClaims, error) {
	invalid := func(reason string) error {
		return apierr.New(apierr.TokenInvalid, "relay token is not valid").With("reason", reason)
	}
	var c relayClaims
	b64body, b64mac, ok := strings.Cut(tok, ".")
	if !ok {
		return c, invalid("malformed")
	}
	body, err1 := relayEncoding.DecodeString(b64body)
	sig, err2 := relayEncoding.DecodeString(b64mac)
	if err1 != nil || err2 != nil {
		return c, invalid("malformed")
	}
	mac := hmac.New(sha256.New, s.deps.RelayKey)
	mac.Write(body)
	if !hmac.Equal(sig, mac.Sum(nil)) {
		return c, invalid("signature")
	}
	if err := json.Unmarshal(body, &c); err != nil {
		return c, invalid("malformed")
	}
	switch {
	case c.Replica != s.deps.Fabric.ReplicaID():
		return c, invalid("wrong_replica")
	case s.deps.Clock.Now().UnixMilli() >= c.Expires:
		return c, apierr.New(apierr.TokenExpired, "relay token has expired")
	case c.Allocated != allocationID.String():
		return c, invalid("wrong_allocation")
	case !s.nonces.use(c.Nonce, time.UnixMilli(c.Expires), s.deps.Clock.Now()):
		return c, invalid("replayed")
	}
	return c, nil
}

// relayable: the stream kinds the relay carries (the terminal's, SSH's and the app
// proxy's; all are plain byte streams once open).
func relayable(k fabricv1.StreamKind) bool {
	return k == fabricv1.StreamKind_STREAM_KIND_TERMINAL || k == fabricv1.StreamKind_STREAM_KIND_SSH ||
		k == fabricv1.StreamKind_STREAM_KIND_APP_PROXY
}

// nonceCache remembers relay token nonces until their tokens expire.
type nonceCache struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

func (n *nonceCache) use(nonce string, exp, now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen == nil {
		n.seen = map[string]time.Time{}
	}
	for k, e := range n.seen {
		if !now.Before(e) {
			delete(n.seen, k)
		}
	}
	if nonce == "" {
		return false
	}
	if _, dup := n.seen[nonce]; dup {
		return false
	}
	n.seen[nonce] = exp
	return true
}

// dialRelay opens the session's stream through the replica holding the node's tunnel.
func (s *Service) dialRelay(octx, bctx context.Context, replica string, nodeID uuid.UUID, pre *fabricv1.StreamPreamble) (net.Conn, error) {
	unreachable := func(err error) error {
		return apierr.New(apierr.ServiceUnavailable, "the control-plane replica holding the node's connection cannot be reached").
			With("reason", "replica_unreachable").Wrap(err)
	}
	base, err := s.relays.lookup(octx, replica)
	if err != nil {
		return nil, unreachable(err)
	}
	preBytes, err := proto.Marshal(pre)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	tok := s.signRelay(relayClaims{
		Replica: replica, Node: nodeID.String(), Preamble: preBytes, Allocated: pre.GetAllocationId(),
		Expires: s.deps.Clock.Now().Add(relayTokenTTL).UnixMilli(), Nonce: hex.EncodeToString(nonce),
	})
	u := base + strings.Replace(RouteRelay, "{allocation_id}", pre.GetAllocationId(), 1)
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok)
	if id := correlation.ID(octx); id != "" {
		h.Set(correlation.HeaderRequestID, id)
	}
	ws, resp, err := websocket.Dial(octx, u, &websocket.DialOptions{
		HTTPClient: s.deps.RelayClient, HTTPHeader: h, Subprotocols: []string{RelaySubprotocol},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, relayedError(resp)
		}
		return nil, unreachable(err)
	}
	if ws.Subprotocol() != RelaySubprotocol {
		_ = ws.CloseNow()
		return nil, unreachable(errors.New("relay answered without its subprotocol"))
	}
	ws.SetReadLimit(relayReadLimit)
	return websocket.NetConn(bctx, ws, websocket.MessageBinary), nil
}

// relayedError turns the holder's envelope into ours (same code, message and status).
func relayedError(resp *http.Response) error {
	var env apierr.Envelope
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&env); err != nil || env.Code == "" {
		return apierr.New(apierr.UpstreamError, "the replica holding the node's connection answered %d", resp.StatusCode)
	}
	e := apierr.New(env.Code, "%s", env.Message).WithStatus(resp.StatusCode)
	for k, v := range env.Details {
		switch k {
		case "service", "trace_id", "span_id", "route", "method":
		default:
			e = e.With(k, v)
		}
	}
	return e
}

// relayPipe is a relayed stream this replica serves.
type relayPipe struct {
	ws *websocket.Conn
	st net.Conn
}

func (p *relayPipe) close() {
	_ = p.st.Close()
	_ = p.ws.CloseNow()
}

// serveRelay is the holder's side: verify the relay token, open the agent's stream as
// the edge asked, upgrade and pipe bytes until either side ends.
func (s *Service) serveRelay(ctx context.Context, w http.ResponseWriter, r *http.Request, allocationID uuid.UUID) error {
	tok, found, err := auth.BearerToken(r)
	if err != nil || (found && tok == "") {
		return apierr.New(apierr.TokenInvalid, "relay token is not valid")
	}
	if !found {
		return apierr.New(apierr.TokenMissing, "relay token required")
	}
	c, err := s.verifyRelay(tok, allocationID)
	if err != nil {
		return err
	}
	nodeID, err := uuid.Parse(c.Node)
	if err != nil {
		return apierr.New(apierr.TokenInvalid, "relay token is not valid")
	}
	var pre fabricv1.StreamPreamble
	if err := proto.Unmarshal(c.Preamble, &pre); err != nil || !relayable(pre.GetKind()) {
		return apierr.New(apierr.TokenInvalid, "relay token is not valid")
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	octx, ocancel := context.WithTimeout(pctx, s.cfg.OpenTimeout)
	st, err := s.deps.Fabric.OpenStream(octx, nodeID, &pre)
	ocancel()
	if err != nil {
		// No second hop: a tunnel that moved again is the edge's to retry.
		return openError(octx, err)
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{RelaySubprotocol}, InsecureSkipVerify: true})
	if err != nil {
		_ = st.Close()
		return nil
	}
	ws.SetReadLimit(relayReadLimit)
	p := &relayPipe{ws: ws, st: st}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		p.close()
		return nil
	}
	s.pipes[p] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pipes, p)
		s.mu.Unlock()
		s.wg.Done()
	}()
	nc := websocket.NetConn(pctx, ws, websocket.MessageBinary)
	const fromEdge, fromAgent = 1, 2
	done := make(chan int, 2)
	go func() { _, _ = io.Copy(st, nc); done <- fromEdge }()
	go func() { _, _ = io.Copy(nc, st); done <- fromAgent }()
	if <-done == fromAgent {
		// The agent ended the stream: close the WebSocket with a handshake, so that the
		// edge reads everything sent before it (an abrupt close could reset it away).
		_ = ws.Close(websocket.StatusNormalClosure, "stream ended")
	}
	p.close()
	<-done
	return nil
}

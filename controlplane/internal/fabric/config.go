package fabric

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Config is the fabric server's configuration. Zero durations take the defaults
// noted; app.Config maps the GANTRY_FABRIC_* variables onto it.
type Config struct {
	// Addr is where to listen, "host:port" (UDP and TCP on the same port number; port 0
	// picks one free for both).
	Addr string
	// PublicAddr is what agents dial (FabricInfo.Addr); default: the bound address.
	PublicAddr string
	// ReplicaID names this control-plane replica in presence: [A-Za-z0-9_-]{1,64}.
	ReplicaID string
	// CertNames are the DNS names / IPs of the server certificate; default: the hosts of
	// PublicAddr and Addr plus "localhost" and "127.0.0.1".
	CertNames []string
	// Bucket is the JetStream KV bucket of presence (default "gantry_fabric_presence").
	Bucket string
	// SubjectPrefix prefixes the NATS subjects between replicas (default "gantry.fabric.").
	SubjectPrefix string
	// DisableUDP serves TLS+yamux only.
	DisableUDP bool
	// MaxConcurrentQUICHandshakes, when positive, bounds QUIC handshakes in progress;
	// attempts over it are refused as busy (fabricnet.ListenOptions). Zero: unbounded,
	// the default (docs/fabric.md, "Reconnect storms").
	MaxConcurrentQUICHandshakes int

	// MinHeartbeatInterval is the shortest heartbeat interval handed out (default 10s).
	MinHeartbeatInterval time.Duration
	// MaxHeartbeatsPerSecond caps the fleet-wide heartbeat rate the interval is scaled
	// to (default 50: 10,000 nodes heartbeat every 200s).
	MaxHeartbeatsPerSecond float64
	// HeartbeatGrace is added to every TTL (default 10s).
	HeartbeatGrace time.Duration
	// StartupTTL is the TTL everyone gets for this long after this replica starts, and
	// the least time a node found online in presence at start is given to reconnect
	// (default 5m).
	StartupTTL time.Duration
	// TelemetryInterval is how often agents send GPU telemetry (default 30s).
	TelemetryInterval time.Duration
	// SweepInterval is how often TTLs are checked and presence refreshed (default 1s).
	SweepInterval time.Duration
	// PresenceRefresh is how stale another replica's view of a node's last heartbeat may
	// get (default 30s).
	PresenceRefresh time.Duration
	// ReplicaRefresh is how often this replica announces it is alive (default 5s); a
	// replica silent for 3x this long is presumed dead and its nodes are reaped.
	ReplicaRefresh time.Duration
	// DispatchTimeout bounds waiting for an agent's ack when the caller's context has no
	// deadline (default 30s).
	DispatchTimeout time.Duration
	// AuthTimeout bounds the auth stream (default 10s).
	AuthTimeout time.Duration
}

var replicaIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (c *Config) setDefaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:7443"
	}
	if c.Bucket == "" {
		c.Bucket = "gantry_fabric_presence"
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = "gantry.fabric."
	}
	if !replicaIDRe.MatchString(c.ReplicaID) {
		return fmt.Errorf("fabric: replica id %q must match %s", c.ReplicaID, replicaIDRe)
	}
	def(&c.MinHeartbeatInterval, 10*time.Second)
	if c.MaxHeartbeatsPerSecond <= 0 {
		c.MaxHeartbeatsPerSecond = 50
	}
	def(&c.HeartbeatGrace, 10*time.Second)
	def(&c.StartupTTL, 5*time.Minute)
	def(&c.TelemetryInterval, 30*time.Second)
	def(&c.SweepInterval, time.Second)
	def(&c.PresenceRefresh, 30*time.Second)
	def(&c.ReplicaRefresh, 5*time.Second)
	def(&c.DispatchTimeout, 30*time.Second)
	def(&c.AuthTimeout, 10*time.Second)
	if c.StartupTTL < c.MinHeartbeatInterval {
		return errors.New("fabric: StartupTTL shorter than the heartbeat interval")
	}
	return nil
}

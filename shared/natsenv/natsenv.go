package natsenv

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultURL is the conventional local server.
const DefaultURL = "nats://127.0.0.1:4222"

// Server is an embedded nats-server with JetStream.
type Server struct {
	srv *server.Server
}

// Embedded starts a nats-server with JetStream on a free 127.0.0.1 port,
// keeping JetStream data in dir. Stop it with Shutdown.
func Embedded(dir string) (*Server, error) {
	opts := &server.Options{
		ServerName: "gantry-embedded",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		NoSigs:     true,
		NoLog:      true,
		JetStream:  true,
		StoreDir:   dir,
		// Keep the HTTP monitor, cluster and leafnode listeners off.
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsenv: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("natsenv: embedded nats-server not ready in 10s")
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return nil, fmt.Errorf("natsenv: embedded nats-server started without JetStream (store %s)", dir)
	}
	return &Server{srv: srv}, nil
}

// URL is nats://127.0.0.1:PORT.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and waits for it. Safe to call more than once.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Reachable reports whether a NATS server answers at url within about a second.
func Reachable(url string) bool {
	nc, err := connect(url)
	if err != nil {
		return false
	}
	nc.Close()
	return true
}

// HasJetStream reports whether a NATS server answers at url within about two
// seconds and has JetStream enabled for this account.
func HasJetStream(url string) bool {
	nc, err := connect(url)
	if err != nil {
		return false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err == nil
}

func connect(url string) (*nats.Conn, error) {
	return nats.Connect(url,
		nats.Name("gantry-natsenv-probe"),
		nats.Timeout(time.Second),
		nats.NoReconnect(),
		nats.RetryOnFailedConnect(false),
	)
}

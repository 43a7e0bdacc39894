package fabricnet_test

import (
	"context"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// A listener over its bound of QUIC handshakes refuses the next attempt at once with
// CONNECTION_REFUSED (fabricnet.ServerBusy), and admits again once a handshake in
// progress completes. The first handshake is held open by its client, whose certificate
// check waits, so the server's side of it stays in progress for as long as the test
// needs: no timing.
func TestQUICHandshakesOverTheBoundAreRefused(t *testing.T) {
	srvTLS, cliTLS := certs(t)
	ln, err := fabricnet.Listen("127.0.0.1:0", srvTLS, &fabricnet.ListenOptions{MaxConcurrentQUICHandshakes: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	accepted := make(chan struct{}, 4)
	go func() {
		for {
			if _, err := ln.Accept(ctx); err != nil {
				return
			}
			accepted <- struct{}{}
		}
	}()
	addr := ln.Addr().String()

	inVerify, release := make(chan struct{}), make(chan struct{})
	held := cliTLS.Clone()
	held.VerifyPeerCertificate = func([][]byte, [][]*x509.Certificate) error {
		close(inVerify)
		<-release
		return nil
	}
	first := make(chan error, 1)
	go func() {
		s, err := fabricnet.Dial(ctx, addr, fabricnet.ModeQUIC, held, nil)
		if err == nil {
			// Kept open until the end: closed at once, the server could see its close
			// with its Finished and never accept it (its slot would still be freed).
			t.Cleanup(func() { _ = s.Close("done") })
		}
		first <- err
	}()
	select {
	case <-inVerify: // the server sent its flight; its handshake waits for our Finished
	case err := <-first:
		t.Fatalf("first dial ended before its certificate check: %v", err)
	}

	_, err = fabricnet.Dial(ctx, addr, fabricnet.ModeQUIC, cliTLS, nil)
	if !fabricnet.ServerBusy(err) {
		t.Fatalf("second dial while one handshake is in progress: %v, want CONNECTION_REFUSED", err)
	}
	// auto does not go around the bound over TCP (which the listener also serves here):
	// the control plane answered on UDP, it is busy.
	s, err := fabricnet.Dial(ctx, addr, fabricnet.ModeAuto, cliTLS, nil)
	if err == nil {
		_ = s.Close("done")
		t.Fatalf("auto dial while busy fell back to %s", s.Transport())
	}
	if !fabricnet.ServerBusy(err) {
		t.Fatalf("auto dial while busy: %v, want CONNECTION_REFUSED", err)
	}
	// At least one: a ClientHello with a post-quantum key share spans two Initial
	// packets, and each packet of a refused attempt is refused on its own.
	if got := ln.QUICRefused(); got < 1 {
		t.Fatalf("QUICRefused = %d, want at least 1", got)
	}

	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first dial: %v", err)
	}
	<-accepted // the server's side of the handshake completed: its slot is free
	s, err = fabricnet.Dial(ctx, addr, fabricnet.ModeQUIC, cliTLS, nil)
	if err != nil {
		t.Fatalf("dial after the handshake in progress completed: %v", err)
	}
	_ = s.Close("done")
}

// A refused attempt is "busy", other failures are not.
func TestServerBusyOnlyForRefusals(t *testing.T) {
	for _, err := range []error{nil, context.DeadlineExceeded, errors.New("tls: bad certificate"), fabricnet.ErrTokenRefused} {
		if fabricnet.ServerBusy(err) {
			t.Errorf("ServerBusy(%v) = true", err)
		}
	}
}

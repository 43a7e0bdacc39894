package fabric_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// handshakeLeaf is the certificate a TLS handshake with the fabric listener presents.
func handshakeLeaf(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	// Verified by the caller against the test's clock: a certificate issued on a clock
	// moved a year ahead is not valid yet by the wall clock.
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{fabricnet.ALPN}, MinVersion: tls.VersionTLS13}) //nolint:gosec // verified below
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

// A replica that runs past its server certificate's renewal point issues the next one
// and presents it on new handshakes, without a restart; before that point it keeps the
// one it has, and a replica starting afterwards finds the renewed one instead of issuing
// another.
func TestServerCertificateRenewedWhileRunning(t *testing.T) {
	fx := newFixture(t)
	ctx := context.Background()
	clk := clock.NewManual(time.Now())
	fx.deps.Clock = clk
	srv, _ := fx.server(fx.config("r1"))
	addr := srv.ListenAddr().String()

	first := handshakeLeaf(t, addr)
	if !first.Equal(srv.Certificate()) {
		t.Fatal("the handshake presented another certificate than the server's")
	}
	clk.Advance(first.NotAfter.Sub(clk.Now()) - 31*24*time.Hour) // 31 days left
	if renewed, err := srv.RenewCertificate(ctx); err != nil || renewed {
		t.Fatalf("renewed with 31 days left: %v %v", renewed, err)
	}
	clk.Advance(2 * 24 * time.Hour) // 29 days left
	if renewed, err := srv.RenewCertificate(ctx); err != nil || !renewed {
		t.Fatalf("not renewed with 29 days left: %v %v", renewed, err)
	}
	second := handshakeLeaf(t, addr)
	if second.Equal(first) || !second.Equal(srv.Certificate()) || !second.NotAfter.After(first.NotAfter.Add(300*24*time.Hour)) {
		t.Fatalf("handshake after renewal: serial %v not after %v (first: %v, %v)", second.SerialNumber, second.NotAfter, first.SerialNumber, first.NotAfter)
	}
	opts := x509VerifyOpts(srv.PKI())
	opts.CurrentTime = clk.Now()
	if _, err := second.Verify(opts); err != nil {
		t.Fatalf("renewed certificate does not chain to the fabric CA: %v", err)
	}
	if renewed, err := srv.RenewCertificate(ctx); err != nil || renewed {
		t.Fatalf("renewed twice: %v %v", renewed, err)
	}

	// A second replica with the same names takes the renewed certificate.
	srv2, _ := fx.server(fx.config("r2"))
	if !srv2.Certificate().Equal(second) {
		t.Fatal("a replica started after the renewal issued its own certificate")
	}
	var certs, audits int
	_ = fx.deps.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM fabric_server_certs), (SELECT count(*) FROM audit_events WHERE action = 'fabric.server_cert.issue')`).Scan(&certs, &audits)
	if certs != 2 || audits != 2 {
		t.Fatalf("%d server certificates, %d issue audit rows; want 2 and 2", certs, audits)
	}
}

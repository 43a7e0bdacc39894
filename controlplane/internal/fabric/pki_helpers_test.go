package fabric_test

import (
	"crypto/x509"

	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
)

func x509VerifyOpts(p *fabric.PKI) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: p.CertPool(), DNSName: "localhost"}
}

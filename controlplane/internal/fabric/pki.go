package fabric

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric/fabricdb"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

const (
	// pkiLockID serializes CA and server-certificate creation across replicas
	// ("gantry.fabric.pki"): two replicas starting at once make one CA.
	pkiLockID int64 = 0x6661_6272_6963_0a01

	caLifetime     = 10 * 365 * 24 * time.Hour
	serverLifetime = 365 * 24 * time.Hour
	// renewBefore: a server certificate this close to expiry is replaced, at start and
	// by the server's check every certCheckInterval (a month of daily-or-better retries
	// before it expires).
	renewBefore       = 30 * 24 * time.Hour
	certCheckInterval = 6 * time.Hour
)

// PKI is the fabric CA (handed to agents at enrollment) and the server certificate the
// fabric listener presents.
type PKI struct {
	CAPEM  []byte
	CA     *x509.Certificate
	Server tls.Certificate
	// ResetKey is the QUIC stateless reset key of the fabric listener, derived from the
	// CA's private key (resetKey).
	ResetKey [32]byte
	// TicketKey encrypts the fabric listener's TLS session tickets, derived from the
	// CA's private key like ResetKey (ticketKey).
	TicketKey [32]byte
}

// resetKeyLabel names what the CA key is stretched into; a new label, a new key.
const resetKeyLabel = "gantry fabric: QUIC stateless reset key v1"

// ticketKeyLabel names the session ticket key stretched from the CA key.
const ticketKeyLabel = "gantry fabric: TLS session ticket key v1"

// ticketKey derives the key of the fabric's TLS session tickets from the CA's private
// key. An agent that reconnects presents the ticket of its last tunnel and the
// handshake resumes: the server neither sends its certificate chain nor signs, and the
// agent verifies neither (the two ECDSA verifications were a tenth of an agent's CPU
// in a fleet reconnect, docs/fabric.md). A per-process random key (crypto/tls's
// default) would be lost with the process, and a restart is exactly when the whole
// fleet reconnects; every replica sharing the CA derives the same key, so a ticket
// from one is good at another. Resumption in TLS 1.3 as crypto/tls does it (psk_dhe_ke)
// still runs a fresh key exchange, so whoever learns this key cannot read recorded
// tunnels; they could impersonate the control plane to an agent holding a ticket, which
// the CA key they learned it from lets them do anyway.
func ticketKey(ca *ecdsa.PrivateKey) ([32]byte, error) { return deriveKey(ca, ticketKeyLabel) }

// resetKey derives the QUIC stateless reset key from the CA's private key with
// HKDF-SHA256. A reset token is an HMAC of a connection id under this key, and an agent
// believes a reset only if its token is the one the control plane gave it with the
// connection: a replica that restarts after a crash must derive the same key to end
// its agents' stale tunnels at once (rather than at their 15 s idle timeout), and every
// replica sharing the CA does, so one taking over another's address does too. Derived
// rather than stored: nothing new to keep secret, rotate or migrate, and it is as
// secret as the CA key it comes from (whoever holds that can impersonate the control
// plane anyway). It changes only with the CA.
func resetKey(ca *ecdsa.PrivateKey) ([32]byte, error) { return deriveKey(ca, resetKeyLabel) }

// deriveKey stretches the CA's private key into a 32-byte key named by label
// (HKDF-SHA256).
func deriveKey(ca *ecdsa.PrivateKey, label string) ([32]byte, error) {
	var k [32]byte
	ek, err := ca.ECDH()
	if err != nil {
		return k, err
	}
	b, err := hkdf.Key(sha256.New, ek.Bytes(), nil, label, len(k))
	if err != nil {
		return k, err
	}
	copy(k[:], b)
	return k, nil
}

// LoadPKI returns the fabric CA and a server certificate valid for names, creating
// either on first use (under an advisory lock, so concurrent replicas agree on one).
// sealKey (32 bytes) encrypts the private keys at rest.
func LoadPKI(ctx context.Context, pool *pgxpool.Pool, sealKey []byte, names []string, clk clock.Clock, idSrc ids.Source) (*PKI, error) {
	if len(sealKey) != 32 {
		return nil, errors.New("fabric: PKI seal key must be 32 bytes")
	}
	names = normalizeNames(names)
	if len(names) == 0 {
		return nil, errors.New("fabric: server certificate needs at least one name")
	}
	al := &audit.Log{Clock: clk, IDs: idSrc}
	var out *PKI
	err := db.InTx(ctx, pool, func(tx pgx.Tx) error {
		q := fabricdb.New(tx)
		if err := q.LockPKI(ctx, pkiLockID); err != nil {
			return fmt.Errorf("lock fabric pki: %w", err)
		}
		now := clk.Now()
		caRow, err := q.GetCA(ctx)
		if errors.Is(err, pgx.ErrNoRows) {
			if caRow, err = createCA(ctx, q, sealKey, now, idSrc); err != nil {
				return err
			}
			if err := al.Record(ctx, tx, audit.Entry{
				Action: "fabric.ca.create", TargetType: "fabric_ca", TargetID: caRow.ID.String(),
				ActorType: audit.ActorSystem,
			}); err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("fabric ca: %w", err)
		}
		caCert, caKey, err := parseKeyPair(caRow.CertPem, caRow.KeyEnc, sealKey, caRow.ID)
		if err != nil {
			return fmt.Errorf("fabric ca: %w", err)
		}
		srv, err := q.LatestServerCert(ctx, fabricdb.LatestServerCertParams{CaID: caRow.ID, Names: names})
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && srv.NotAfter.Before(now.Add(renewBefore))) {
			if srv, err = issueServerCert(ctx, q, caRow.ID, caCert, caKey, sealKey, names, now, idSrc); err != nil {
				return err
			}
			if err := al.Record(ctx, tx, audit.Entry{
				Action: "fabric.server_cert.issue", TargetType: "fabric_server_cert", TargetID: srv.ID.String(),
				ActorType: audit.ActorSystem, Metadata: map[string]any{"names": names},
			}); err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("fabric server certificate: %w", err)
		}
		srvCert, srvKey, err := parseKeyPair(srv.CertPem, srv.KeyEnc, sealKey, srv.ID)
		if err != nil {
			return fmt.Errorf("fabric server certificate: %w", err)
		}
		rk, err := resetKey(caKey)
		if err != nil {
			return fmt.Errorf("fabric reset key: %w", err)
		}
		tk, err := ticketKey(caKey)
		if err != nil {
			return fmt.Errorf("fabric session ticket key: %w", err)
		}
		out = &PKI{
			ResetKey:  rk,
			TicketKey: tk,
			CAPEM:     []byte(caRow.CertPem),
			CA:        caCert,
			Server: tls.Certificate{
				Certificate: [][]byte{srvCert.Raw, caCert.Raw},
				PrivateKey:  srvKey,
				Leaf:        srvCert,
			},
		}
		return nil
	})
	return out, err
}

// CertPool is a pool holding only the fabric CA (what an agent trusts).
func (p *PKI) CertPool() *x509.CertPool {
	cp := x509.NewCertPool()
	cp.AddCert(p.CA)
	return cp
}

func normalizeNames(names []string) []string {
	var out []string
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n != "" && len(n) <= 253 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func createCA(ctx context.Context, q *fabricdb.Queries, sealKey []byte, now time.Time, idSrc ids.Source) (fabricdb.GetCARow, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fabricdb.GetCARow{}, err
	}
	id := idSrc.New()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Gantry fabric CA " + id.String()[:8], Organization: []string{"Gantry"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fabricdb.GetCARow{}, fmt.Errorf("create fabric ca: %w", err)
	}
	row := fabricdb.GetCARow{ID: id, CertPem: pemCert(der), NotAfter: tmpl.NotAfter, CreatedAt: now}
	if row.KeyEnc, err = sealKeyPair(key, sealKey, id); err != nil {
		return fabricdb.GetCARow{}, err
	}
	err = q.InsertCA(ctx, fabricdb.InsertCAParams{ID: id, CertPem: row.CertPem, KeyEnc: row.KeyEnc, NotAfter: row.NotAfter, CreatedAt: now})
	if err != nil {
		return fabricdb.GetCARow{}, fmt.Errorf("insert fabric ca: %w", err)
	}
	return row, nil
}

func issueServerCert(ctx context.Context, q *fabricdb.Queries, caID uuid.UUID, ca *x509.Certificate, caKey *ecdsa.PrivateKey,
	sealKey []byte, names []string, now time.Time, idSrc ids.Source) (fabricdb.FabricServerCert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fabricdb.FabricServerCert{}, err
	}
	id := idSrc.New()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0], Organization: []string{"Gantry"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(serverLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fabricdb.FabricServerCert{}, fmt.Errorf("issue fabric server certificate: %w", err)
	}
	row := fabricdb.FabricServerCert{ID: id, CaID: caID, CertPem: pemCert(der), Names: names, NotAfter: tmpl.NotAfter, CreatedAt: now}
	if row.KeyEnc, err = sealKeyPair(key, sealKey, id); err != nil {
		return fabricdb.FabricServerCert{}, err
	}
	if err := q.InsertServerCert(ctx, fabricdb.InsertServerCertParams{
		ID: id, CaID: caID, CertPem: row.CertPem, KeyEnc: row.KeyEnc, Names: names, NotAfter: row.NotAfter, CreatedAt: now,
	}); err != nil {
		return fabricdb.FabricServerCert{}, fmt.Errorf("insert fabric server certificate: %w", err)
	}
	return row, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func pemCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// sealKeyPair encrypts the PKCS#8 DER of key with AES-256-GCM; the row id is the
// additional data.
func sealKeyPair(key *ecdsa.PrivateKey, sealKey []byte, id uuid.UUID) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	gcm, err := newGCM(sealKey)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return nil, err
	}
	return gcm.Seal(nonce, nonce, der, id[:]), nil
}

func parseKeyPair(certPEM string, keyEnc, sealKey []byte, id uuid.UUID) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode([]byte(certPEM))
	if blk == nil {
		return nil, nil, errors.New("certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	gcm, err := newGCM(sealKey)
	if err != nil {
		return nil, nil, err
	}
	if len(keyEnc) < gcm.NonceSize() {
		return nil, nil, errors.New("sealed key too short")
	}
	der, err := gcm.Open(nil, keyEnc[:gcm.NonceSize()], keyEnc[gcm.NonceSize():], id[:])
	if err != nil {
		return nil, nil, errors.New("cannot decrypt private key (wrong GANTRY_MASTER_KEY?)")
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("private key is not ECDSA")
	}
	return cert, ek, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

package sshkeys_test

import (
	"crypto/dsa"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/binary"
	"math/big"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/sshkeys"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func authorized(t testing.TB, pub any, comment string) string {
	t.Helper()
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
	if comment != "" {
		line += " " + comment
	}
	return line
}

func ed25519Line(t testing.TB, comment string) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return authorized(t, pub, comment)
}

func ecdsaLine(t testing.TB, c elliptic.Curve) string {
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return authorized(t, &k.PublicKey, "")
}

var rsaKeys sync.Map

func rsaLine(t testing.TB, bits int) string {
	if v, ok := rsaKeys.Load(bits); ok {
		return v.(string)
	}
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	line := authorized(t, &k.PublicKey, "")
	rsaKeys.Store(bits, line)
	return line
}

// dsaLine builds an ssh-dss authorized_keys line by hand (RFC 4253 §6.6: the strings
// "ssh-dss", p, q, g, y): x/crypto/ssh no longer marshals DSA keys, and clients that
// still hold one must keep getting the clear refusal.
func dsaLine(t testing.TB) string {
	var k dsa.PrivateKey
	if err := dsa.GenerateParameters(&k.Parameters, rand.Reader, dsa.L1024N160); err != nil {
		t.Fatal(err)
	}
	if err := dsa.GenerateKey(&k, rand.Reader); err != nil {
		t.Fatal(err)
	}
	var blob []byte
	str := func(b []byte) {
		blob = binary.BigEndian.AppendUint32(blob, uint32(len(b)))
		blob = append(blob, b...)
	}
	mpint := func(n *big.Int) {
		b := n.Bytes()
		if len(b) > 0 && b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		str(b)
	}
	str([]byte("ssh-dss"))
	for _, n := range []*big.Int{k.P, k.Q, k.G, k.Y} {
		mpint(n)
	}
	return "ssh-dss " + base64.StdEncoding.EncodeToString(blob)
}

// skEd25519Line builds a security-key Ed25519 public key (sk-ssh-ed25519@openssh.com).
func skEd25519Line(t testing.TB) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blob := ssh.Marshal(struct {
		Name        string
		Key         []byte
		Application string
	}{ssh.KeyAlgoSKED25519, pub, "ssh:"})
	k, err := ssh.ParsePublicKey(blob)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) + " yubikey"
}

func TestParse(t *testing.T) {
	type want struct {
		typ    string
		bits   int
		reason string // refused with this reason when set
	}
	ed := ed25519Line(t, "alice@laptop")
	for _, c := range []struct {
		name string
		line string
		want want
	}{
		{"ed25519 with comment", ed, want{typ: ssh.KeyAlgoED25519, bits: 256}},
		{"ed25519 with surrounding whitespace", "\n  " + ed + "  \r\n", want{typ: ssh.KeyAlgoED25519, bits: 256}},
		{"ecdsa p256", ecdsaLine(t, elliptic.P256()), want{typ: ssh.KeyAlgoECDSA256, bits: 256}},
		{"ecdsa p384", ecdsaLine(t, elliptic.P384()), want{typ: ssh.KeyAlgoECDSA384, bits: 384}},
		{"ecdsa p521", ecdsaLine(t, elliptic.P521()), want{typ: ssh.KeyAlgoECDSA521, bits: 521}},
		{"rsa 4096", rsaLine(t, 4096), want{typ: ssh.KeyAlgoRSA, bits: 4096}},
		{"rsa 2048", rsaLine(t, 2048), want{typ: ssh.KeyAlgoRSA, bits: 2048}},
		{"sk ed25519", skEd25519Line(t), want{typ: ssh.KeyAlgoSKED25519, bits: 256}},
		{"rsa 1024 is weak", rsaLine(t, 1024), want{reason: "weak_key"}},
		{"dsa", dsaLine(t), want{reason: "unsupported_key_type"}},
		{"garbage", "not a key at all", want{reason: "invalid_key"}},
		{"truncated base64", ed[:40], want{reason: "invalid_key"}},
		{"empty", "   ", want{reason: "invalid_key"}},
		{"private key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----", want{reason: "invalid_key"}},
		{"two keys", ed + "\n" + ed25519Line(t, ""), want{reason: "invalid_key"}},
		{"options", `command="/bin/sh" ` + ed, want{reason: "options_not_allowed"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := sshkeys.Parse(c.line)
			if c.want.reason != "" {
				var e *apierr.Error
				if !errorsAs(err, &e) || e.Code != apierr.ValidationError || e.HTTPStatus() != 422 ||
					e.Details["field"] != "public_key" || e.Details["reason"] != c.want.reason {
					t.Fatalf("want validation_error/%s, got %v (%+v)", c.want.reason, err, e)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Type != c.want.typ || got.Bits != c.want.bits || !strings.HasPrefix(got.Fingerprint, "SHA256:") {
				t.Fatalf("parsed = %+v", got)
			}
			if fields := strings.Fields(got.PublicKey); len(fields) != 2 || fields[0] != got.Type {
				t.Fatalf("normalised key = %q", got.PublicKey)
			}
		})
	}
	p, err := sshkeys.Parse(ed)
	if err != nil || p.Comment != "alice@laptop" || strings.Contains(p.PublicKey, "alice") {
		t.Fatalf("comment kept apart: %+v, %v", p, err)
	}
}

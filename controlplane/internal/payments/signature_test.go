package payments_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/payments"
	"github.com/gantry-gpu/gantry/controlplane/internal/payments/stripefake"
)

// A vector computed outside Go:
//
//	printf '1700000000.{"id":"evt_1","object":"event"}' | openssl dgst -sha256 -hmac whsec_test_secret
const (
	vecSecret = "whsec_test_secret"
	vecBody   = `{"id":"evt_1","object":"event"}`
	vecSig    = "0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd"
)

var vecTime = time.Unix(1700000000, 0)

func TestVerifySignatureVectors(t *testing.T) {
	body := []byte(vecBody)
	good := "t=1700000000,v1=" + vecSig
	flipped := []byte(vecBody)
	flipped[7] ^= 0x01 // one byte of the body changed
	badSig := "t=1700000000,v1=" + vecSig[:10] + "1" + vecSig[11:]
	old, rotated := "whsec_old", "whsec_new"
	byOld := stripefake.Sign(body, vecTime, old)
	byBoth := stripefake.Sign(body, vecTime, rotated, old)
	nine := "t=1700000000" + strings.Repeat(",v1="+vecSig, 9)

	cases := []struct {
		name    string
		header  string
		body    []byte
		secrets []string
		now     time.Time
		want    string // "" accepts
	}{
		{"valid (openssl vector)", good, body, []string{vecSecret}, vecTime, ""},
		{"valid, Sign agrees with openssl", stripefake.Sign(body, vecTime, vecSecret), body, []string{vecSecret}, vecTime, ""},
		{"one body byte changed", good, flipped, []string{vecSecret}, vecTime, "signature_mismatch"},
		{"one signature hex digit changed", badSig, body, []string{vecSecret}, vecTime, "signature_mismatch"},
		{"wrong secret", good, body, []string{"whsec_other"}, vecTime, "signature_mismatch"},
		{"exactly 300 s old", good, body, []string{vecSecret}, vecTime.Add(300 * time.Second), ""},
		{"301 s old: stale", good, body, []string{vecSecret}, vecTime.Add(301 * time.Second), "timestamp_too_old"},
		{"30 s in the future", good, body, []string{vecSecret}, vecTime.Add(-30 * time.Second), ""},
		{"31 s in the future", good, body, []string{vecSecret}, vecTime.Add(-31 * time.Second), "timestamp_in_future"},
		{"an hour in the future", good, body, []string{vecSecret}, vecTime.Add(-time.Hour), "timestamp_in_future"},
		{"rotation: signed by the old secret, both configured", byOld, body, []string{rotated, old}, vecTime, ""},
		{"rotation: signed by the old secret, old one removed", byOld, body, []string{rotated}, vecTime, "signature_mismatch"},
		{"two v1 values, the second matches", "t=1700000000,v1=" + strings.Repeat("ab", 32) + ",v1=" + vecSig, body, []string{vecSecret}, vecTime, ""},
		{"two v1 values from two secrets, only the new configured", byBoth, body, []string{rotated}, vecTime, ""},
		{"two v1 values from two secrets, only the old configured", byBoth, body, []string{old}, vecTime, ""},
		{"malformed v1 next to a good one", "t=1700000000,v1=zz,v1=" + vecSig, body, []string{vecSecret}, vecTime, ""},
		{"v0 only", "t=1700000000,v0=" + vecSig, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"spaces after commas", "t=1700000000, v1=" + vecSig, body, []string{vecSecret}, vecTime, ""},
		{"missing header", "", body, []string{vecSecret}, vecTime, "signature_missing"},
		{"no timestamp", "v1=" + vecSig, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"two timestamps", "t=1700000000,t=1700000001,v1=" + vecSig, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"timestamp not a number", "t=17e8,v1=" + vecSig, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"timestamp with a sign", "t=+1700000000,v1=" + vecSig, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"timestamp with a leading zero", "t=01700000000,v1=" + vecSig, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"no equals sign", "t1700000000,v1=" + vecSig, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"more than 8 v1 values", nine, body, []string{vecSecret}, vecTime, "signature_malformed"},
		{"no secret configured", good, body, nil, vecTime, "no_secret_configured"},
		{"signature of the empty body does not cover a body", stripefake.Sign(nil, vecTime, vecSecret), body, []string{vecSecret}, vecTime, "signature_mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var secrets [][]byte
			for _, s := range tc.secrets {
				secrets = append(secrets, []byte(s))
			}
			err := payments.VerifySignature(tc.header, tc.body, secrets, tc.now)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Fatalf("VerifySignature = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSignMatchesStripeFake(t *testing.T) {
	body := []byte(`{"id":"evt_2"}`)
	at := time.Unix(1800000000, 0)
	if a, b := payments.Sign(body, at, []byte("k1"), []byte("k2")), stripefake.Sign(body, at, "k1", "k2"); a != b {
		t.Fatalf("Sign = %s, stripefake.Sign = %s", a, b)
	}
}

// BenchmarkVerifySignature: a typical 2 KiB event, two configured secrets, two v1 values
// (the rotation worst case: four HMACs).
func BenchmarkVerifySignature(b *testing.B) {
	body := []byte(`{"id":"evt_1","object":"event","pad":"` + strings.Repeat("x", 2048) + `"}`)
	header := stripefake.Sign(body, vecTime, "whsec_new", "whsec_old")
	secrets := [][]byte{[]byte("whsec_new"), []byte("whsec_old")}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := payments.VerifySignature(header, body, secrets, vecTime); err != nil {
			b.Fatal(err)
		}
	}
}

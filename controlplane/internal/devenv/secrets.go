package devenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
)

// SecretsFile is the name of the secrets file in the dev directory.
const SecretsFile = "secrets.env"

// Variables of secrets.env.
const (
	VarMasterKey     = "GANTRY_MASTER_KEY"
	VarAdminPassword = "GANTRY_ADMIN_PASSWORD"
	VarDemoPassword  = "GANTRY_DEMO_PASSWORD"
	// VarDemoClientSecret is the secret of the demo service account's credential
	// (client id DemoClientID): the seed stores its hash.
	VarDemoClientSecret = "GANTRY_DEMO_CLIENT_SECRET"
)

// Secrets are the development secrets, kept in <dir>/secrets.env.
type Secrets struct {
	MasterKey     string // base64 of 32 random bytes
	AdminPassword string
	DemoPassword  string
	// DemoClientSecret is the demo service account's client secret (gcs_…).
	DemoClientSecret string
}

// LoadSecrets reads <dir>/secrets.env, generates whatever is missing or unusable, and
// (re)writes the file with mode 0600 when anything changed or its mode was wider.
// generated names the variables it had to create.
func LoadSecrets(dir string) (s Secrets, generated []string, err error) {
	path := filepath.Join(dir, SecretsFile)
	vars, err := ReadEnvFile(path)
	if err != nil {
		return Secrets{}, nil, fmt.Errorf("read %s: %w", path, err)
	}
	s = Secrets{MasterKey: vars[VarMasterKey], AdminPassword: vars[VarAdminPassword], DemoPassword: vars[VarDemoPassword],
		DemoClientSecret: vars[VarDemoClientSecret]}
	if _, err := auth.ParseMasterKey(s.MasterKey); err != nil {
		if s.MasterKey, err = newMasterKey(); err != nil {
			return Secrets{}, nil, err
		}
		generated = append(generated, VarMasterKey)
	}
	for _, pw := range []struct {
		name string
		v    *string
	}{{VarAdminPassword, &s.AdminPassword}, {VarDemoPassword, &s.DemoPassword}} {
		if auth.ValidatePassword(*pw.v) == nil {
			continue
		}
		if *pw.v, err = NewPassword(); err != nil {
			return Secrets{}, nil, err
		}
		generated = append(generated, pw.name)
	}
	if !auth.IsClientSecret(s.DemoClientSecret) {
		if s.DemoClientSecret, err = newClientSecret(); err != nil {
			return Secrets{}, nil, err
		}
		generated = append(generated, VarDemoClientSecret)
	}
	fi, statErr := os.Stat(path)
	if len(generated) == 0 && statErr == nil && fi.Mode().Perm() == 0o600 {
		return s, nil, nil
	}
	err = WriteEnvFile(path, "Development secrets of `make dev`: generated once, reused on every run.\nDelete this file to get new ones (make dev then resets the seeded passwords).", []Var{
		{VarMasterKey, s.MasterKey},
		{VarAdminPassword, s.AdminPassword},
		{VarDemoPassword, s.DemoPassword},
		{VarDemoClientSecret, s.DemoClientSecret},
	})
	if err != nil {
		return Secrets{}, nil, fmt.Errorf("write %s: %w", path, err)
	}
	return s, generated, nil
}

func newMasterKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// passwordAlphabet leaves out look-alikes (0/o, 1/l/i).
const passwordAlphabet = "abcdefghjkmnpqrstuvwxyz23456789"

// NewPassword returns a random, readable password: four groups of five characters
// joined by dashes (23 characters, about 99 bits).
func NewPassword() (string, error) {
	var b strings.Builder
	max := big.NewInt(int64(len(passwordAlphabet)))
	for i := 0; i < 20; i++ {
		if i > 0 && i%5 == 0 {
			b.WriteByte('-')
		}
		n, err := rand.Int(rand.Reader, max)
		if err != nil {
			return "", err
		}
		b.WriteByte(passwordAlphabet[n.Int64()])
	}
	return b.String(), nil
}

// newClientSecret is a client secret of the shape machineid issues.
func newClientSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return auth.ClientSecretPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

package devenv

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
)

// SSHKeyFile is the demo SSH private key in the dev directory (its public half has .pub).
const SSHKeyFile = "demo_ed25519"

// ensureSSHKey creates <dir>/demo_ed25519{,.pub} once: a key the console's "add an SSH
// key" example can register without touching the developer's own keys.
func ensureSSHKey(dir string) (string, error) {
	priv := filepath.Join(dir, SSHKeyFile)
	pub := priv + ".pub"
	if _, err := os.Stat(pub); err == nil {
		return pub, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	pk, sk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	block, err := ssh.MarshalPrivateKey(sk, "gantry-dev-demo")
	if err != nil {
		return "", fmt.Errorf("demo ssh key: %w", err)
	}
	sshPub, err := ssh.NewPublicKey(pk)
	if err != nil {
		return "", fmt.Errorf("demo ssh key: %w", err)
	}
	if err := writeFileAtomic(priv, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", err
	}
	line := append(bytes.TrimSuffix(ssh.MarshalAuthorizedKey(sshPub), []byte("\n")), " gantry-dev-demo\n"...)
	if err := writeFileAtomic(pub, line, 0o644); err != nil {
		return "", err
	}
	return pub, nil
}

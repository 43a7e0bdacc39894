package auth

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	good := base64.StdEncoding.EncodeToString(make([]byte, 32))
	cases := []struct {
		name    string
		env     map[string]string
		dev     bool
		wantErr string
	}{
		{name: "missing master key outside dev", wantErr: "GANTRY_MASTER_KEY is required"},
		{name: "missing master key in dev", dev: true},
		{name: "short master key", env: map[string]string{"GANTRY_MASTER_KEY": base64.StdEncoding.EncodeToString(make([]byte, 16))}, dev: true, wantErr: "32 bytes"},
		{name: "not base64", env: map[string]string{"GANTRY_MASTER_KEY": "!!!"}, wantErr: "base64"},
		{name: "good key", env: map[string]string{"GANTRY_MASTER_KEY": good}},
		{name: "url-safe unpadded key", env: map[string]string{"GANTRY_MASTER_KEY": base64.RawURLEncoding.EncodeToString(make([]byte, 32))}},
		{name: "tiny ttl", env: map[string]string{"GANTRY_MASTER_KEY": good, "GANTRY_ACCESS_TOKEN_TTL": "1s"}, wantErr: "GANTRY_ACCESS_TOKEN_TTL"},
		{name: "login memory shorter than the longest lock", env: map[string]string{"GANTRY_MASTER_KEY": good, "GANTRY_LOGIN_FAILURE_MEMORY": "5m"}, wantErr: "GANTRY_LOGIN_FAILURE_MEMORY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"GANTRY_MASTER_KEY", "GANTRY_ACCESS_TOKEN_TTL", "GANTRY_PERSONAL_SIGNUP", "INTERNAL_JWKS_REFRESH_TOKEN", "GANTRY_LOGIN_FAILURE_MEMORY"} {
				t.Setenv(k, "")
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, err := LoadConfig(tc.dev)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !cfg.MasterKey.IsSet() {
				t.Fatal("master key not set")
			}
			want := DefaultConfig()
			if cfg.Issuer != want.Issuer || cfg.Audience != want.Audience || cfg.AccessTokenTTL != 15*time.Minute ||
				cfg.RefreshTokenTTL != want.RefreshTokenTTL || cfg.SigningKeyRotation != want.SigningKeyRotation || !cfg.PersonalSignup ||
				cfg.loginPolicy() != want.loginPolicy() || cfg.LoginFreeFailures != 5 {
				t.Errorf("defaults = %+v", cfg)
			}
		})
	}
	t.Run("overrides", func(t *testing.T) {
		t.Setenv("GANTRY_MASTER_KEY", good)
		t.Setenv("GANTRY_JWT_ISSUER", "https://gantry.example")
		t.Setenv("GANTRY_PERSONAL_SIGNUP", "false")
		t.Setenv("INTERNAL_JWKS_REFRESH_TOKEN", "tok")
		t.Setenv("GANTRY_SIGNING_KEY_ROTATION", "168h")
		cfg, err := LoadConfig(false)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Issuer != "https://gantry.example" || cfg.PersonalSignup || cfg.InternalJWKSRefreshToken != "tok" || cfg.SigningKeyRotation != 7*24*time.Hour {
			t.Errorf("cfg = %+v", cfg)
		}
	})
}

func TestMasterKeyNeverPrints(t *testing.T) {
	k := testMasterKey(0x41)
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s", k, k, k, k), fmt.Sprintf("%+v", Config{MasterKey: k})} {
		if strings.Contains(s, "ABCD") || strings.Contains(s, "65 66") {
			t.Errorf("master key bytes printed: %s", s)
		}
	}
}

func TestMasterKeyDerive(t *testing.T) {
	a, b := testMasterKey(1), testMasterKey(2)
	if string(a.Derive("x")) != string(a.Derive("x")) || len(a.Derive("x")) != 32 {
		t.Fatal("Derive is not a deterministic 32-byte key")
	}
	if string(a.Derive("x")) == string(a.Derive("y")) || string(a.Derive("x")) == string(b.Derive("x")) {
		t.Fatal("Derive does not separate purposes or master keys")
	}
}

// Package profile owns the CLI's on-disk state: one file in the user config directory
// (os.UserConfigDir()/gantry/config.json, or $GANTRY_CONFIG_DIR/config.json) holding a
// named profile per control plane with its URL, tokens and chosen project. The file holds
// bearer tokens and may hold a service account's client secret, so it is written 0600
// (its directory 0700) and replaced atomically; it never holds a user's password.
package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// DefaultName is the profile used when neither --profile nor GANTRY_PROFILE names one.
const DefaultName = "default"

// Profile is one control plane and the login held for it.
type Profile struct {
	URL              string    `json:"url"`
	Username         string    `json:"username,omitempty"`
	ProjectID        string    `json:"project_id,omitempty"`
	AccessToken      string    `json:"access_token,omitempty"`
	AccessExpiresAt  time.Time `json:"access_expires_at,omitzero"`
	RefreshToken     string    `json:"refresh_token,omitempty"`
	RefreshExpiresAt time.Time `json:"refresh_expires_at,omitzero"`
	// A service account has no refresh token: the CLI trades its credential again.
	ClientID     string `json:"client_id,omitempty"`
	ClientSecret string `json:"client_secret,omitempty"`
}

// LoggedIn reports whether the profile holds a login at all (it may have expired).
func (p Profile) LoggedIn() bool { return p.AccessToken != "" }

// ClearLogin forgets every token and credential, keeping the URL and project.
func (p *Profile) ClearLogin() {
	*p = Profile{URL: p.URL, ProjectID: p.ProjectID}
}

// File is the whole config file.
type File struct {
	Current  string              `json:"current_profile,omitempty"`
	Profiles map[string]*Profile `json:"profiles"`
}

// Store reads and writes the config file at one path.
type Store struct{ Path string }

// DefaultStore is the config file of this user.
func DefaultStore() (Store, error) {
	dir := os.Getenv("GANTRY_CONFIG_DIR")
	if dir == "" {
		base, err := os.UserConfigDir()
		if err != nil {
			return Store{}, fmt.Errorf("find the user config directory: %w (set GANTRY_CONFIG_DIR)", err)
		}
		dir = filepath.Join(base, "gantry")
	}
	return Store{Path: filepath.Join(dir, "config.json")}, nil
}

// Load reads the file; a missing file is an empty one.
func (s Store) Load() (*File, error) {
	f := &File{Profiles: map[string]*Profile{}}
	b, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, f); err != nil {
		return nil, fmt.Errorf("%s is not a valid config file: %w", s.Path, err)
	}
	if f.Profiles == nil {
		f.Profiles = map[string]*Profile{}
	}
	return f, nil
}

// Save writes the file with 0600 permissions through a temporary file and a rename, so
// a crash never leaves half a file and the tokens are never readable by others, even
// for a moment.
func (s Store) Save(f *File) error {
	dir := filepath.Dir(s.Path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".config-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.Path)
}

// Names lists the profiles, sorted.
func (f *File) Names() []string {
	out := make([]string, 0, len(f.Profiles))
	for n := range f.Profiles {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Get returns the named profile, creating an empty one.
func (f *File) Get(name string) *Profile {
	p, ok := f.Profiles[name]
	if !ok {
		p = &Profile{}
		f.Profiles[name] = p
	}
	return p
}

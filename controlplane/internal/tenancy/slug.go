package tenancy

import (
	"encoding/hex"
	"regexp"
	"strings"
)

var (
	nonSlug     = regexp.MustCompile(`[^a-z0-9]+`)
	slugPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,62}$`)
)

// maxBaseSlug leaves room for a collision suffix within the 63 characters of the pattern.
const maxBaseSlug = 48

// Slugify derives a slug from a display name: lowercase ASCII letters and digits joined
// by single dashes. Names with nothing usable fall back to fallback.
func Slugify(name, fallback string) string {
	s := strings.Trim(nonSlug.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if len(s) > maxBaseSlug {
		s = strings.TrimRight(s[:maxBaseSlug], "-")
	}
	switch {
	case s == "":
		s = fallback
	case len(s) < 2:
		s = s + "-" + fallback
	}
	return s
}

// ValidSlug reports whether s matches the contract's slug pattern (seed §8).
func ValidSlug(s string) bool { return slugPattern.MatchString(s) }

// suffixed is base plus a short suffix taken from the random tail of a fresh id.
func suffixed(base string, id [16]byte) string {
	return base + "-" + hex.EncodeToString(id[13:16])
}

// slugAttempts bounds the retries of a derived slug that keeps colliding.
const slugAttempts = 6

// candidates yields base first and then suffixed variants, one per attempt.
func (s *Service) slugCandidate(base string, attempt int) string {
	if attempt == 0 {
		return base
	}
	return suffixed(base, s.IDs.New())
}

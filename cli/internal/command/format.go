package command

import (
	"fmt"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/proto/api"
)

// minorDigits of the currencies that do not have two (ISO 4217).
var minorDigits = map[string]int{"JPY": 0, "KRW": 0, "VND": 0, "CLP": 0, "ISK": 0, "BHD": 3, "KWD": 3, "OMR": 3, "JOD": 3, "TND": 3}

// money formats minor units exactly (no floats): 12345 USD -> "123.45 USD".
func money(m api.Money) string {
	d, ok := minorDigits[strings.ToUpper(m.Currency)]
	if !ok {
		d = 2
	}
	neg := m.AmountMinor < 0
	v := m.AmountMinor
	if neg {
		v = -v
	}
	s := fmt.Sprint(v)
	if d > 0 {
		for len(s) <= d {
			s = "0" + s
		}
		s = s[:len(s)-d] + "." + s[len(s)-d:]
	}
	if neg {
		s = "-" + s
	}
	return s + " " + m.Currency
}

func moneyPtr(m *api.Money) string {
	if m == nil {
		return ""
	}
	return money(*m)
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func tsPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return ts(*t)
}

func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func secs(n int) time.Duration { return time.Duration(n) * time.Second }

package ledger

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on what a claim may carry. They keep one record small (bbolt keeps
// a whole page per value) and one request sane; they are checked before any
// state is touched.
const (
	// MaxIDLen is the longest claim ID; a VM's UUID or a node name fits.
	MaxIDLen = 128
	// DefaultMaxGPUs is the most GPUs one claim may hold unless WithMaxGPUs
	// says otherwise; no server on offer holds more.
	DefaultMaxGPUs = 16
	// MaxModelLen is the longest model name ("RTX PRO 6000 Blackwell", "10de:2bb5").
	MaxModelLen = 64
	// MaxLabels is the most holder labels on one claim.
	MaxLabels = 32
	// MaxLabelKeyLen and MaxLabelValueLen bound one label, in bytes.
	MaxLabelKeyLen   = 63
	MaxLabelValueLen = 256
	// MaxDrainReasonLen bounds the reason an operator gives for a drain.
	MaxDrainReasonLen = 256
	// MaxCoordinatorLen bounds the coordinator's name (a host name).
	MaxCoordinatorLen = 253
)

// ValidateID checks a claim ID: 1 to MaxIDLen characters of [A-Za-z0-9._-].
// IDs become bbolt keys, file names in logs and URL path segments, so the
// alphabet is the one that is safe in all three without escaping.
func ValidateID(id string) error {
	if id == "" {
		return &ValidationError{Field: "id", Reason: "must not be empty"}
	}
	if len(id) > MaxIDLen {
		return &ValidationError{Field: "id", Reason: fmt.Sprintf("is %d characters long; at most %d", len(id), MaxIDLen)}
	}
	for i := 0; i < len(id); i++ {
		if !idByte(id[i]) {
			return &ValidationError{Field: "id", Reason: fmt.Sprintf("%q has %q at byte %d; use only letters, digits, '.', '_' and '-'", id, id[i], i)}
		}
	}
	// "." and ".." would be path segments in the API's URLs; an ID that
	// starts with a letter or digit never is one.
	if c := id[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
		return &ValidationError{Field: "id", Reason: fmt.Sprintf("%q must start with a letter or a digit", id)}
	}
	return nil
}

func idByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-'
}

// ValidateRequest checks a request's shape (not whether this server can
// serve it): at least one item, each with a model and a count of at least 1,
// no model twice, at most maxGPUs GPUs in total (maxGPUs < 1 means
// DefaultMaxGPUs), and bounded labels. Errors are *ValidationError.
//
// A model listed twice is refused rather than merged: the caller that sent it
// has a bug, and merging would make two different-looking requests equal for
// idempotency.
func ValidateRequest(req Request, maxGPUs int) error {
	if maxGPUs < 1 {
		maxGPUs = DefaultMaxGPUs
	}
	if len(req.Items) == 0 {
		return &ValidationError{Field: "items", Reason: "must list at least one model and count"}
	}
	total := 0
	seen := map[string]int{}
	for i, it := range req.Items {
		field := fmt.Sprintf("items[%d]", i)
		if err := validateModel(it.Model); err != nil {
			return &ValidationError{Field: field + ".model", Reason: err.Error()}
		}
		if j, dup := seen[it.Model]; dup {
			return &ValidationError{Field: field + ".model", Reason: fmt.Sprintf("%q is already asked for in items[%d]; ask once with the total count", it.Model, j)}
		}
		seen[it.Model] = i
		if it.Count < 1 {
			return &ValidationError{Field: field + ".count", Reason: fmt.Sprintf("is %d; must be at least 1", it.Count)}
		}
		if it.Count > maxGPUs {
			return &ValidationError{Field: field + ".count", Reason: fmt.Sprintf("is %d; a claim holds at most %d GPUs", it.Count, maxGPUs)}
		}
		total += it.Count
	}
	if total > maxGPUs {
		return &ValidationError{Field: "items", Reason: fmt.Sprintf("ask for %d GPUs in total; a claim holds at most %d", total, maxGPUs)}
	}
	if err := validateDevices(req.Devices, total); err != nil {
		return err
	}
	return validateLabels(req.Labels)
}

// validateDevices checks a pinned request's GPUs: one PCI address per GPU
// asked for, each well formed, sorted and given once.
func validateDevices(devices []string, total int) error {
	if len(devices) == 0 {
		return nil
	}
	if len(devices) != total {
		return &ValidationError{Field: "devices", Reason: fmt.Sprintf("names %d GPUs for a request of %d; name one PCI address per GPU", len(devices), total)}
	}
	for i, a := range devices {
		field := fmt.Sprintf("devices[%d]", i)
		if !pciAddress.MatchString(a) {
			return &ValidationError{Field: field, Reason: fmt.Sprintf("%.40q is not a PCI address like 0000:3b:00.0", a)}
		}
		if i > 0 && devices[i-1] >= a {
			return &ValidationError{Field: field, Reason: fmt.Sprintf("%s: the addresses must be sorted and each given once", a)}
		}
	}
	return nil
}

func validateModel(m string) error {
	switch {
	case m == "":
		return fmt.Errorf("must not be empty")
	case len(m) > MaxModelLen:
		return fmt.Errorf("is %d bytes long; at most %d", len(m), MaxModelLen)
	case !printable(m):
		return fmt.Errorf("%q has non-printable characters", m)
	case strings.TrimSpace(m) != m:
		return fmt.Errorf("%q has leading or trailing spaces", m)
	}
	return nil
}

func validateLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return &ValidationError{Field: "labels", Reason: fmt.Sprintf("has %d entries; at most %d", len(labels), MaxLabels)}
	}
	// Sorted, so that a request with several bad labels always gets the
	// same answer.
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		v := labels[k]
		field := fmt.Sprintf("labels[%q]", k)
		if len(k) > 2*MaxLabelKeyLen {
			// Never echo a huge key back whole: errors go into logs and
			// answers.
			field = fmt.Sprintf("labels[%q…]", k[:MaxLabelKeyLen])
		}
		switch {
		case k == "":
			return &ValidationError{Field: "labels", Reason: "has an empty key"}
		case len(k) > MaxLabelKeyLen:
			return &ValidationError{Field: field, Reason: fmt.Sprintf("key is %d bytes long; at most %d", len(k), MaxLabelKeyLen)}
		case !printable(k) || strings.ContainsAny(k, " =,"):
			return &ValidationError{Field: field, Reason: "key must be printable, without spaces, '=' or ','"}
		case len(v) > MaxLabelValueLen:
			return &ValidationError{Field: field, Reason: fmt.Sprintf("value is %d bytes long; at most %d", len(v), MaxLabelValueLen)}
		case !printable(v):
			return &ValidationError{Field: field, Reason: "value must be printable UTF-8"}
		}
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters,
// so that it prints on one line in tables and logs.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

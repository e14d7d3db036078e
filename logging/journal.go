package logging

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

// Journal writes records to the systemd journal natively: each record is
// one entry with a real priority (journalctl -p err shows the errors), its
// message as MESSAGE, and every attribute as its own field, upper-cased
// (pci_address becomes PCI_ADDRESS, a group's attributes get the group as
// prefix). The journal keeps its own timestamp, so none is added. When the
// journal cannot be reached, the record goes to fallback instead.
type Journal struct {
	fallback slog.Handler
	level    slog.Leveler
	prefix   string      // group prefix for attributes added from here on
	attrs    []slog.Attr // attributes of WithAttrs, already prefixed
	send     func(msg string, p journal.Priority, vars map[string]string) error
}

// NewJournal returns a journal handler at level; fallback gets the records
// the journal refuses.
func NewJournal(level slog.Leveler, fallback slog.Handler) *Journal {
	return &Journal{fallback: fallback, level: level, send: journal.Send}
}

// StderrIsJournal reports whether systemd connected stderr to the journal
// (JOURNAL_STREAM names stderr's device and inode), the condition under
// which logging natively loses nothing an operator would see otherwise.
func StderrIsJournal() bool {
	ok, err := journal.StderrIsJournalStream()
	return ok && err == nil
}

// Priority maps a slog level to a syslog priority (sd-daemon(3)).
func Priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	}
	return journal.PriDebug
}

// Enabled implements slog.Handler.
func (h *Journal) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

// WithAttrs implements slog.Handler.
func (h *Journal) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(h.attrs[:len(h.attrs):len(h.attrs)], prefixed(h.prefix, as)...)
	c.fallback = h.fallback.WithAttrs(as)
	return &c
}

// WithGroup implements slog.Handler.
func (h *Journal) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix = h.prefix + name + "_"
	c.fallback = h.fallback.WithGroup(name)
	return &c
}

// Handle implements slog.Handler.
func (h *Journal) Handle(ctx context.Context, r slog.Record) error {
	vars := map[string]string{"SYSLOG_IDENTIFIER": "gpuherd"}
	for _, a := range h.attrs {
		addField(vars, "", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		addField(vars, h.prefix, a)
		return true
	})
	if err := h.send(r.Message, Priority(r.Level), vars); err != nil {
		return h.fallback.Handle(ctx, r)
	}
	return nil
}

func prefixed(prefix string, as []slog.Attr) []slog.Attr {
	if prefix == "" {
		return as
	}
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = slog.Attr{Key: prefix + a.Key, Value: a.Value}
	}
	return out
}

// addField adds an attribute as a journal field, a group as one field per
// member. Values are written the same way on every record, whatever their
// Go type: a duration as "1.5s", a time in RFC 3339, an error as its text.
func addField(vars map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "_"
		}
		for _, m := range v.Group() {
			addField(vars, p, m)
		}
		return
	}
	if a.Key == "" {
		return
	}
	name := fieldName(prefix + a.Key)
	if name == "" || name == "MESSAGE" || name == "PRIORITY" {
		name = "GPUHERD_" + name
	}
	var s string
	switch v.Kind() {
	case slog.KindTime:
		s = v.Time().UTC().Format(time.RFC3339Nano)
	case slog.KindDuration:
		s = v.Duration().String()
	default:
		s = v.String()
	}
	vars[name] = s
}

// fieldName makes a journal field name: upper-case letters, digits and
// underscores, not starting with an underscore (those are the journal's
// own trusted fields) or a digit.
func fieldName(key string) string {
	b := []byte(strings.ToUpper(key))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	s := strings.TrimLeft(string(b), "_")
	if s != "" && s[0] >= '0' && s[0] <= '9' {
		s = "F_" + s
	}
	return s
}

// StableValue writes a duration as text ("1.5s") in every format: the JSON
// handler would write nanoseconds, so the same field would change type
// between a text and a JSON log, and read as a number nobody can scale.
func StableValue(a slog.Attr) slog.Attr {
	if v := a.Value.Resolve(); v.Kind() == slog.KindDuration {
		return slog.String(a.Key, v.Duration().String())
	}
	return a
}

package logging

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

type entry struct {
	msg  string
	pri  journal.Priority
	vars map[string]string
}

func TestJournalPrioritiesAndFields(t *testing.T) {
	var got []entry
	var fb bytes.Buffer
	h := NewJournal(slog.LevelDebug, slog.NewTextHandler(&fb, nil))
	h.send = func(msg string, p journal.Priority, vars map[string]string) error {
		got = append(got, entry{msg, p, vars})
		return nil
	}
	log := slog.New(h).With("component", "vfio")
	log.Error("bind failed", "pci_address", "0000:3b:00.0", "err", errors.New("timeout"), "took", 1500*time.Millisecond)
	log.Warn("slow", slog.Group("req", "id", "vm-1"))
	log.Info("claimed", "gpus", 2)
	log.Debug("detail")
	if len(got) != 4 {
		t.Fatalf("%d entries", len(got))
	}
	for i, want := range []journal.Priority{journal.PriErr, journal.PriWarning, journal.PriInfo, journal.PriDebug} {
		if got[i].pri != want {
			t.Errorf("entry %d %q: priority %d, want %d", i, got[i].msg, got[i].pri, want)
		}
	}
	e := got[0].vars
	for k, v := range map[string]string{"COMPONENT": "vfio", "PCI_ADDRESS": "0000:3b:00.0", "ERR": "timeout", "TOOK": "1.5s", "SYSLOG_IDENTIFIER": "gpuherd"} {
		if e[k] != v {
			t.Errorf("field %s = %q, want %q (all: %v)", k, e[k], v, e)
		}
	}
	if _, ok := e["TIME"]; ok {
		t.Error("a time field: the journal keeps its own")
	}
	if got[1].vars["REQ_ID"] != "vm-1" {
		t.Errorf("group field: %v", got[1].vars)
	}
	if fb.Len() != 0 {
		t.Errorf("fallback used: %s", fb.String())
	}

	h.send = func(string, journal.Priority, map[string]string) error { return errors.New("no journal") }
	slog.New(h).Warn("still seen")
	if !strings.Contains(fb.String(), "still seen") {
		t.Error("a record the journal refused is lost")
	}
}

func TestFieldName(t *testing.T) {
	for in, want := range map[string]string{"pci_address": "PCI_ADDRESS", "_SYSTEMD_UNIT": "SYSTEMD_UNIT", "a.b-c": "A_B_C", "9x": "F_9X"} {
		if got := fieldName(in); got != want {
			t.Errorf("fieldName(%q) = %q, want %q", in, got, want)
		}
	}
}

// StderrIsJournal follows JOURNAL_STREAM as systemd sets it: the device and
// inode of the stream stderr is connected to.
func TestStderrIsJournal(t *testing.T) {
	var st syscall.Stat_t
	if err := syscall.Fstat(2, &st); err != nil {
		t.Skip(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	if !StderrIsJournal() {
		t.Error("JOURNAL_STREAM names stderr, but StderrIsJournal is false")
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1))
	if StderrIsJournal() {
		t.Error("JOURNAL_STREAM names another stream, but StderrIsJournal is true")
	}
	os.Unsetenv("JOURNAL_STREAM")
	if StderrIsJournal() {
		t.Error("no JOURNAL_STREAM, but StderrIsJournal is true")
	}
}

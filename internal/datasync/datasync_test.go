package datasync

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestFileSyncsWhatWasWritten(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("record"); err != nil {
		t.Fatal(err)
	}
	if err := File(f); err != nil {
		t.Fatalf("File: %v", err)
	}
}

// A file closed before the sync is os.ErrClosed, as f.Sync says, so that
// a caller that closed it on purpose (the registry's log removing a
// segment) can tell that from a disk that failed.
func TestAClosedFileIsErrClosed(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := File(f); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("File of a closed file: %v, want os.ErrClosed", err)
	}
	if err := f.Sync(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("f.Sync of a closed file: %v (the behaviour File matches)", err)
	}
}

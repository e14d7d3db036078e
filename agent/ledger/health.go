package ledger

// WriteError is why the last write to the file was not acknowledged (a
// full or read-only disk), or nil when it was: an agent whose ledger
// refuses writes cannot take claims, and /readyz says so.
func (l *Ledger) WriteError() error {
	if p := l.writeErr.Load(); p != nil {
		return *p
	}
	return nil
}

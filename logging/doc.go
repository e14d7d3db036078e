// Package logging holds the agent's slog handlers: one that writes to the
// systemd journal natively (real priorities, structured fields) when
// stderr is the journal, and one that rate-limits bursts of identical
// warnings with a count.
package logging

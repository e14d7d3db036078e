// Package pki is gpuherd's mutual-TLS plumbing: a small private CA, node
// certificates signed by it, and the tls.Config values that agents use to
// talk to each other.
//
// Every agent is both a server (its API) and a client (it coordinates claims
// on its peers), so one certificate per node carries both ServerAuth and
// ClientAuth. A node's identity is its node name, carried in the subject
// common name and in a "gpuherd:node:NAME" URI SAN; see NodeName.
//
// Certificates and keys are re-read when their files change, so rotating a
// node certificate needs no restart. The CA bundle is read once, when a
// config is built: rotating the CA is a planned, cluster-wide step (ship a
// bundle holding the old and the new CA, restart, reissue, drop the old CA,
// restart) and a restart keeps every agent's trust decisions in step.
package pki

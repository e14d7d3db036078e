// Package packaging holds what goes into the gpuherd deb and rpm besides the
// binaries (gpuherd, gpuherd-kubelet-plugin): the nfpm configuration,
// maintainer scripts, the default config, the modules-load.d file, the
// Grafana dashboard and the Prometheus alerts. It has no code; its tests
// keep those files in step with the agent.
package packaging

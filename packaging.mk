# Packages: `make packages` builds gpuherd and gpuherd-kubelet-plugin for
# amd64 and arm64 and wraps each pair in a deb and an rpm (4 files in dist/);
# `make check-packages` lists what is inside and fails when an expected path
# or script is missing.
# Included from the Makefile; uses its GO, LDFLAGS and VERSION.
#
# Needs: gcc for the host and <triplet>-gcc for the other architecture
# (go-nvml is cgo, it has no pure-Go build), dpkg-deb and rpm for the checks.
# On Debian: apt-get install gcc gcc-aarch64-linux-gnu libc6-dev-arm64-cross rpm

DIST          ?= dist
PKG_ARCHES    ?= amd64 arm64
# A release sets PKG_VERSION (semver, no "v"). Otherwise: the tag HEAD sits
# on, or a development version that sorts below every release.
PKG_VERSION   ?= $(or $(patsubst v%,%,$(shell git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null)),0.0.0-dev.$(shell git rev-list --count HEAD 2>/dev/null || echo 0)+g$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown))
# Who answers for the packages: the Maintainer (deb) and Packager (rpm).
PKG_MAINTAINER ?= gpuherd maintainers <maintainers@gpuherd.dev>
GOHOSTARCH    ?= $(shell $(GO) env GOHOSTARCH)
# The C cross compiler of each architecture; the host's own is plain gcc.
CC_amd64      ?= $(if $(filter amd64,$(GOHOSTARCH)),gcc,x86_64-linux-gnu-gcc)
CC_arm64      ?= $(if $(filter arm64,$(GOHOSTARCH)),gcc,aarch64-linux-gnu-gcc)
# nfpm runs on this host: it gets GOARCH=$(GOHOSTARCH) whatever the target
# (`go tool` would otherwise build it for the package's architecture).
NFPM          ?= $(GO) tool nfpm

# What every package must hold; check-packages fails without it.
PKG_PATHS_COMMON := /usr/bin/gpuherd /usr/bin/gpuherd-kubelet-plugin /etc/gpuherd/gpuherd.yaml \
	/etc/modules-load.d/gpuherd-vfio.conf /var/lib/gpuherd \
	/usr/share/doc/gpuherd/operations.md /usr/share/doc/gpuherd/README.md \
	/usr/share/doc/gpuherd/libvirt.md /etc/libvirt/hooks/qemu.d/50-gpuherd \
	/usr/share/man/man1/gpuherd.1.gz /usr/share/man/man1/gpuherd-agent.1.gz \
	/usr/share/man/man1/gpuherd-claim.1.gz /usr/share/man/man1/gpuherd-kubelet-plugin.1.gz \
	/usr/share/bash-completion/completions/gpuherd \
	/usr/share/gpuherd/grafana/gpuherd-dashboard.json \
	/usr/share/gpuherd/prometheus/gpuherd-alerts.yml \
	/usr/share/gpuherd/prometheus/gpuherd-dcgm.rules.yml
PKG_PATHS_deb := $(PKG_PATHS_COMMON) /lib/systemd/system/gpuherd.service \
	/usr/share/doc/gpuherd/copyright /usr/share/doc/gpuherd/changelog.Debian.gz
PKG_PATHS_rpm := $(PKG_PATHS_COMMON) /usr/lib/systemd/system/gpuherd.service \
	/usr/share/licenses/gpuherd/LICENSE

.PHONY: packages check-packages package-binaries package-docs

# The package changelog: a release's is packaging/changelog.yaml, which must
# have an entry for it; a development build's is one generated entry naming
# its commit (see packaging/changelog.yaml).
PKG_CHANGELOG ?= $(DIST)/changelog.yaml
PKG_RELEASE   := $(shell git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null)

# nfpm does not glob files of type doc: the rpm gets one entry per man page,
# appended to a copy of nfpm.yaml (whose last key is contents).
packages: package-binaries package-docs
	@if [ -n '$(PKG_RELEASE)' ]; then \
		grep -q -- '^- semver: "*$(PKG_VERSION)"*$$' packaging/changelog.yaml || \
			{ echo "packages: release $(PKG_VERSION) has no entry in packaging/changelog.yaml" >&2; exit 1; }; \
		cp packaging/changelog.yaml $(PKG_CHANGELOG); \
	else \
		printf -- '- semver: %s\n  date: %s\n  packager: %s\n  deb:\n    urgency: low\n    distributions: [unstable]\n  changes:\n    - note: Development build of commit %s.\n' \
			'$(PKG_VERSION)' "$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)" '$(PKG_MAINTAINER)' \
			"$$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" > $(PKG_CHANGELOG); \
	fi; \
	sed 's#^changelog: .*#changelog: $(PKG_CHANGELOG)#' packaging/nfpm.yaml > $(DIST)/nfpm.yaml; \
	for page in $(DIST)/man/*.1.gz; do \
		printf '  - src: %s\n    dst: /usr/share/man/man1/%s\n    type: doc\n    packager: rpm\n    file_info: {mode: 0644}\n' \
			"$$page" "$${page##*/}" >> $(DIST)/nfpm.yaml; \
	done; \
	for arch in $(PKG_ARCHES); do \
		for fmt in deb rpm; do \
			PKG_ARCH=$$arch PKG_VERSION='$(PKG_VERSION)' PKG_DIST='$(DIST)' PKG_MAINTAINER='$(PKG_MAINTAINER)' GOARCH=$(GOHOSTARCH) \
				$(NFPM) package --config $(DIST)/nfpm.yaml --packager $$fmt --target $(DIST)/ || exit 1; \
		done; \
	done
	@ls -l $(DIST)/*.deb $(DIST)/*.rpm

# -z lazy (in LDFLAGS): the binary starts on hosts without libnvidia-ml.
# -buildmode=pie: position independent, as distributions build.
# -s -w: packaged binaries carry no symbol table or DWARF (distributions
# ship stripped binaries; lintian and rpmlint check it).
package-binaries:
	@mkdir -p $(DIST)
	@for arch in $(PKG_ARCHES); do \
		cc=$$(case $$arch in amd64) echo '$(CC_amd64)';; arm64) echo '$(CC_arm64)';; *) echo "no C compiler known for $$arch" >&2; exit 1;; esac) || exit 1; \
		echo "go build linux/$$arch (CC=$$cc)"; \
		for cmd in gpuherd gpuherd-kubelet-plugin; do \
			CGO_ENABLED=1 GOOS=linux GOARCH=$$arch CC=$$cc \
				$(GO) build -trimpath -buildmode=pie -ldflags '-s -w $(LDFLAGS)' -o $(DIST)/$$cmd-linux-$$arch ./cmd/$$cmd || exit 1; \
		done; \
	done

# Man pages of every command (generated from the commands' own help by the
# hidden `gpuherd man` and `gpuherd-kubelet-plugin man`) and gpuherd's bash
# completion, from binaries this host can run (the text is the same on every
# architecture). SOURCE_DATE_EPOCH, the commit's time, dates the pages so
# that two builds give the same bytes.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH

package-docs: package-binaries
	@bin=$(DIST)/gpuherd-linux-$(GOHOSTARCH); \
	test -x $$bin || { echo "package-docs: no $$bin (add $(GOHOSTARCH) to PKG_ARCHES)" >&2; exit 1; }; \
	rm -rf $(DIST)/man $(DIST)/completion; mkdir -p $(DIST)/man $(DIST)/completion; \
	env -u GPUHERD_SOCKET $$bin man --dir $(DIST)/man || exit 1; \
	env -u GPUHERD_SOCKET $(DIST)/gpuherd-kubelet-plugin-linux-$(GOHOSTARCH) man --dir $(DIST)/man || exit 1; \
	gzip -9n $(DIST)/man/*.1; \
	test -f $(DIST)/man/gpuherd-claim.1.gz || { echo "package-docs: no man page for claim" >&2; exit 1; }; \
	test -f $(DIST)/man/gpuherd-kubelet-plugin.1.gz || { echo "package-docs: no man page for gpuherd-kubelet-plugin" >&2; exit 1; }; \
	$$bin completion bash > $(DIST)/completion/gpuherd.bash

check-packages:
	@set -e; n=0; \
	for arch in $(PKG_ARCHES); do \
		deb=$$(ls $(DIST)/gpuherd_*_$$arch.deb); \
		echo "== $$deb"; dpkg-deb -I $$deb; dpkg-deb -c $$deb; \
		list=$$(dpkg-deb -c $$deb | awk '{print $$6}' | sed 's#^\.##; s#/$$##'); \
		for p in $(PKG_PATHS_deb); do echo "$$list" | grep -qx "$$p" || { echo "MISSING in $$deb: $$p" >&2; n=$$((n+1)); }; done; \
		ctl=$$(mktemp -d); dpkg-deb -e $$deb $$ctl; \
		for s in postinst prerm postrm; do test -x $$ctl/$$s || { echo "MISSING in $$deb: $$s" >&2; n=$$((n+1)); }; done; \
		for c in /etc/gpuherd/gpuherd.yaml /etc/libvirt/hooks/qemu.d/50-gpuherd; do grep -qx $$c $$ctl/conffiles || { echo "NOT A CONFFILE in $$deb: $$c" >&2; n=$$((n+1)); }; done; \
		rm -rf $$ctl; \
		rpmarch=$$(case $$arch in amd64) echo x86_64;; arm64) echo aarch64;; esac); \
		rpm=$$(ls $(DIST)/gpuherd-*.$$rpmarch.rpm); \
		echo "== $$rpm"; rpm -qip $$rpm; rpm -qlvp $$rpm; rpm -qp --scripts $$rpm; \
		list=$$(rpm -qlp $$rpm); \
		for p in $(PKG_PATHS_rpm); do echo "$$list" | grep -qx "$$p" || { echo "MISSING in $$rpm: $$p" >&2; n=$$((n+1)); }; done; \
		for s in postinstall preuninstall postuninstall; do rpm -qp --scripts $$rpm | grep -q "^$$s scriptlet" || { echo "MISSING in $$rpm: $$s scriptlet" >&2; n=$$((n+1)); }; done; \
		rpm -qp --configfiles $$rpm | grep -qx /etc/gpuherd/gpuherd.yaml || { echo "NOT %config in $$rpm: /etc/gpuherd/gpuherd.yaml" >&2; n=$$((n+1)); }; \
	done; \
	test $$n -eq 0 || { echo "check-packages: $$n problem(s)" >&2; exit 1; }; \
	echo "check-packages: ok"

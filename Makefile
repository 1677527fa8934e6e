# vmgate — build, image, demo and test targets. See README.md.
GO        ?= go
BIN       ?= bin
# Where images and VM directories live; the default matches vmgated's own.
STATE_DIR ?= $(shell if [ "$$(id -u)" = 0 ]; then echo /var/lib/vmgate; else echo $${XDG_STATE_HOME:-$$HOME/.local/state}/vmgate; fi)
IMAGE_DIR ?= $(STATE_DIR)/image
TEST_TIMEOUT ?= 45m

# Debian packages needed to build images, run VMs and run the tests.
DEB_PACKAGES = qemu-system-x86 qemu-utils mmdebstrap e2fsprogs libseccomp-dev \
               ca-certificates gcc make cpio systemd iproute2 openssh-client \
               busybox-static

.PHONY: all build deps image demo install test unit lint clean man

all: build

# The commit goes into --version of vmgated and vm-exec (the toolchain stamps
# it only with -buildvcs). Not into the agent: it would change the image inputs.
VERSION_X = -X github.com/vmgate/vmgate/internal/version.commit=$(shell git rev-parse HEAD 2>/dev/null)

build:
	CGO_ENABLED=0 $(GO) build -trimpath -tags osusergo,netgo -ldflags='-s -w' -o $(BIN)/vmgate-agent ./cmd/vmgate-agent
	$(GO) build -trimpath -ldflags='$(VERSION_X)' -o $(BIN)/vmgated ./cmd/vmgated
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w $(VERSION_X)' -o $(BIN)/vm-exec ./cmd/vm-exec

# Man pages of vmgated and vm-exec, from their help texts, into man/.
man:
	$(GO) run ./cmd/mangen -out man

# Installs the Debian packages vmgate needs (root).
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

# Builds the guest image (a no-op when it is up to date).
image: build
	$(BIN)/vmgated image build --out $(IMAGE_DIR)

# Fresh machine to a first command in a VM: through the installed service
# where systemd is PID 1 (as root), else through a temporary daemon.
demo: deps image
	BIN=$(BIN) STATE_DIR=$(STATE_DIR) IMAGE_DIR=$(IMAGE_DIR) ./contrib/demo.sh

# System-wide install (root): binaries to /usr/local, user vmgate, units,
# policy if absent, image, then the service (docs/operator.md). Idempotent.
install: deps build
	BIN=$(BIN) ./contrib/install.sh

# The whole test suite: unit tests and integration tests that boot real VMs
# from the shared image. First, the readers of guest bytes (the fuzz targets'
# seed corpora and the unit tests) under the race detector: ~20 s with a warm
# build cache, ~3 min of CPU from a cold one (gVisor built for -race).
test: deps image
	$(GO) vet ./...
	$(GO) test -race -count=1 -run 'Fuzz|Test' ./guest/agentconn/ ./guest/agentproto/ ./internal/transfer/ ./internal/netwire/ ./vm/netstack/
	VMGATE_TEST_IMAGE=$(IMAGE_DIR) VMGATE_TEST_BIN=$(abspath $(BIN)) VMGATE_TEST_TEMPLATES=$(abspath $(STATE_DIR))/test-templates $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# Unit tests only (no VM, no image).
unit:
	$(GO) test -short -count=1 ./...

lint:
	$(GO) vet ./...
	gofmt -l . | tee /dev/stderr | (! read)

clean:
	rm -rf $(BIN)

#!/usr/bin/env bash
# Shared helpers for amrtree's scripts: dependency install, build, running
# PostgreSQL as an unprivileged user.  Sourced, not executed.

set -euo pipefail

AMR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_MAJOR=15
# AMR_PG_ROOT: a relocated copy of the PostgreSQL packages (made by
# scripts/private-pg.sh) to build, install and test against instead of the
# system's, so that several worktrees can run their suites at once without
# installing over each other.  Empty: the system's packages.
AMR_PG_ROOT="${AMR_PG_ROOT:-}"
PG_BIN="${AMR_PG_ROOT}/usr/lib/postgresql/${PG_MAJOR}/bin"
PG_PGXS="${AMR_PG_ROOT}/usr/lib/postgresql/${PG_MAJOR}/lib/pgxs"
# TAP tests reserve ports through lock files here, shared by every run
export PG_TEST_PORT_DIR="${PG_TEST_PORT_DIR:-/tmp/amrtree-portlock}"
# PostgreSQL refuses to run as root: servers run as this user.
AMR_PG_USER="${AMR_PG_USER:-postgres}"

DEB_PACKAGES=(
	"postgresql-${PG_MAJOR}" "postgresql-server-dev-${PG_MAJOR}" postgresql-contrib
	"postgresql-${PG_MAJOR}-postgis-3"
	libpmemobj-dev libpmem-dev liburing-dev libipc-run-perl
	build-essential pkg-config perl python3 rsync procps
	pg-bsd-indent
)

say() { printf '\n==> %s\n' "$*"; }

# Run a command with root privileges (directly when root, else sudo).
as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Remove /dev/shm files named <prefix>-<pid>-... whose process <pid> is gone:
# pools (and their .grow files and the .unusable-* copies a server set
# aside) of test or benchmark runs that were killed.  /dev/shm is memory,
# and it can outlive a run by days on a machine that keeps it across
# restarts.  Usage: remove_orphaned_pools prefix...
remove_orphaned_pools() {
	local prefix f runner
	for prefix in "$@"; do
		for f in /dev/shm/"$prefix"-*; do
			[ -e "$f" ] || continue
			runner=${f#/dev/shm/"$prefix"-}
			runner=${runner%%-*}
			case "$runner" in
				'' | *[!0-9]*) continue ;;
			esac
			[ -d "/proc/$runner" ] || as_root rm -f "$f"
		done
	done
}

# Run a command as the unprivileged PostgreSQL user, in the given directory.
as_pg() {
	local dir="$1"; shift
	if [ "$(id -un)" = "$AMR_PG_USER" ]; then
		(cd "$dir" && "$@")
	elif [ "$(id -u)" -eq 0 ]; then
		# runuser keeps the environment we pass explicitly through env
		runuser -u "$AMR_PG_USER" -- env -C "$dir" "$@"
	else
		sudo -u "$AMR_PG_USER" env -C "$dir" "$@"
	fi
}

install_deps() {
	local missing=()
	local p
	for p in "${DEB_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		say "dependencies already installed"
		return 0
	fi
	say "installing: ${missing[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	# Debian's postgresql-common may create and start a default cluster; we do
	# not use it, and it must not hold port 5432 for our throwaway clusters.
	if command -v pg_lsclusters >/dev/null 2>&1; then
		pg_lsclusters -h 2>/dev/null | while read -r ver name port status _; do
			[ "$status" = online ] && as_root pg_ctlcluster "$ver" "$name" stop || true
		done
	fi
	id "$AMR_PG_USER" >/dev/null 2>&1 || { echo "user $AMR_PG_USER missing after install" >&2; exit 1; }
}

# Build and install the extension.  Warnings are errors here: the code is
# kept warning-free under -Wall -Wextra.
build_install() {
	say "building amrtree"
	local log
	log="$(mktemp)"
	if ! make -C "$AMR_ROOT" -s PG_CONFIG="$PG_BIN/pg_config" 2>"$log"; then
		cat "$log" >&2; rm -f "$log"; exit 1
	fi
	if grep -E ': (warning|error):' "$log" >&2; then
		echo "build produced warnings (see above)" >&2; rm -f "$log"; exit 1
	fi
	rm -f "$log"
	# a missing definition only shows when the server loads the library
	if nm -D "$AMR_ROOT/amrtree.so" | grep -E ' U (amr_|amrtree_)' >&2; then
		echo "amrtree.so has unresolved amrtree symbols (see above)" >&2; exit 1
	fi
	say "installing amrtree into $($PG_BIN/pg_config --pkglibdir)"
	as_root make -C "$AMR_ROOT" -s install PG_CONFIG="$PG_BIN/pg_config" >/dev/null
}

# A directory the PostgreSQL user owns, under $1 if that is reachable by it,
# else under /tmp.  Prints the path.
pg_owned_dir() {
	local want="$1"
	mkdir -p "$want"
	as_root chown "$AMR_PG_USER" "$want"
	if as_pg / test -w "$want" 2>/dev/null; then
		echo "$want"
	else
		local alt
		alt="$(mktemp -d /tmp/amrtree.XXXXXX)"
		as_root chown "$AMR_PG_USER" "$alt"
		echo "note: $want is not reachable by user $AMR_PG_USER; using $alt" >&2
		echo "$alt"
	fi
}

# A free TCP port on localhost, starting from $1.
free_port() {
	local port="${1:-55432}"
	while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
		port=$((port + 1))
	done
	echo "$port"
}

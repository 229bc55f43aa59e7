#!/usr/bin/env bash
# Shared by bench/compare, bench/budget_sweep and bench/shards: dependencies,
# build, and a run of a Python driver (bench/amrbench.py, or the file in
# BENCH_PY) as the unprivileged PostgreSQL user, with its throwaway clusters
# removed on exit and on Ctrl-C.  Sourced, not executed.

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

BENCH_PACKAGES=(python3-matplotlib)
# compare --data coast: GMT dumps the GSHHG shorelines (bench/coast_gen.py);
# -low has the crude, low and intermediate resolutions, -high the next one
# (for more than ~415,000 boxes).  GMT's recommends (Ghostscript, DCW
# borders, ...) are for maps and not needed here.
COAST_PACKAGES=(gmt gmt-gshhg-low gmt-gshhg-high)

# install_packages [--no-install-recommends] PACKAGE...: those not installed yet
install_packages() {
	local opts=() missing=() p
	if [ "${1:-}" = --no-install-recommends ]; then opts+=("$1"); shift; fi
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	say "installing: ${missing[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}

install_bench_deps() {
	install_packages "${BENCH_PACKAGES[@]}"
}

# run_driver COMMAND [--no-deps] [driver options...]
# runs "python3 DRIVER --workdir W --results R COMMAND options", where DRIVER
# is $BENCH_PY if set (a driver file of its own, taking the same arguments),
# else bench/amrbench.py (COMMAND compare or budget_sweep).
run_driver() {
	local cmd="$1"; shift
	local py="${BENCH_PY:-$AMR_ROOT/bench/amrbench.py}"
	local deps=1 args=() a prev='' data=porto rows='' quick=0
	for a in "$@"; do
		case "$a" in
			--no-deps) deps=0 ;;
			-h|--help) /usr/bin/python3 "$py" --workdir . "$cmd" --help; exit 0 ;;
			*) args+=("$a") ;;
		esac
		# what the coastline data below depends on
		case "$prev" in --data) data="$a" ;; --rows) rows="$a" ;; esac
		case "$a" in --data=*) data="${a#--data=}" ;; --rows=*) rows="${a#--rows=}" ;; --quick) quick=1 ;; esac
		prev="$a"
	done
	if [ "$deps" = 1 ]; then
		install_deps
		install_bench_deps
		if [ "$data" = coast ]; then install_packages --no-install-recommends "${COAST_PACKAGES[@]}"; fi
	fi
	if [ "$data" = coast ]; then
		# made here, as the invoking user, and cached in bench/data/: the
		# driver runs as the PostgreSQL user, who cannot write there.  The
		# sizes: --quick as for the Porto data; otherwise coast_gen's
		# default, the scale of the coastline figures in the issues
		if [ -z "$rows" ]; then
			if [ "$quick" = 1 ]; then rows=100000; else rows=220000; fi
		fi
		say "coastline boxes (bench/coast_gen.py --boxes $rows)"
		local file
		file="$(/usr/bin/python3 "$AMR_ROOT/bench/coast_gen.py" --boxes "$rows")"
		args+=(--data-file "$file")
	fi
	build_install

	BENCH_WORK="$(pg_owned_dir "$AMR_ROOT/bench/.run")"
	# pid and time: a pid alone can repeat after a restart that kept /dev/shm
	BENCH_TAG="$$-$(date +%s)"
	remove_orphaned_pools amrbench
	mkdir -p "$BENCH_WORK/results"
	as_root chown "$AMR_PG_USER" "$BENCH_WORK/results"
	trap bench_cleanup EXIT
	trap 'exit 130' INT TERM HUP

	local rc=0
	as_pg "$BENCH_WORK" env AMR_PG_BIN="$PG_BIN" AMRBENCH_TAG="$BENCH_TAG" \
		AMR_COMMIT="$(git -C "$AMR_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" \
		/usr/bin/python3 "$py" --workdir "$BENCH_WORK" \
		--results "$BENCH_WORK/results" "$cmd" "${args[@]}" || rc=$?
	# results come back into the source tree
	mkdir -p "$AMR_ROOT/bench/results"
	local d
	for d in "$BENCH_WORK"/results/*; do
		[ -d "$d" ] || continue
		# an interrupted run may have written nothing yet
		if [ -z "$(ls -A "$d")" ]; then rm -rf "$d"; continue; fi
		cp -r "$d" "$AMR_ROOT/bench/results/"
		rm -rf "$d"
		echo "copied to bench/results/$(basename "$d")"
	done
	return $rc
}

# Whatever the driver left behind if it was killed: its servers and pools.
bench_cleanup() {
	local pid
	for pid in "$BENCH_WORK"/*/data/postmaster.pid; do
		[ -f "$pid" ] || continue
		as_pg / "$PG_BIN/pg_ctl" -D "$(dirname "$pid")" -m immediate stop >/dev/null 2>&1 || true
	done
	# pools, .grow files, and copies a server set aside as .unusable-*
	rm -f /dev/shm/amrbench-"$BENCH_TAG"-* 2>/dev/null || true
	as_root find "$BENCH_WORK" -mindepth 1 -maxdepth 1 -type d ! -name results -exec rm -rf {} + 2>/dev/null || true
}

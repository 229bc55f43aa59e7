#!/usr/bin/env bash
# The whole amrtree test suite, from a fresh Debian 12 machine:
#   dependencies -> build (warnings fail) -> install -> core unit tests
#   -> pg_regress -> isolation -> TAP (restart, crash, pgbench, limits)
# Servers run as the unprivileged "postgres" user in throwaway clusters with
# amrtree in shared_preload_libraries.  Ends with "N passed, N failed".
#
# Usage: scripts/test.sh [--no-deps] [--only core|regress|isolation|tap] [TAP files...]
#   AMR_REGRESS_TESTS / AMR_ISOLATION_TESTS (space-separated) run a subset;
#   AMR_TAP_JOBS is how many TAP files run at a time (default 2).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DO_DEPS=1
ONLY=""
TAP_FILES=()
while [ $# -gt 0 ]; do
	case "$1" in
		--no-deps) DO_DEPS=0 ;;
		--only) ONLY="$2"; shift ;;
		-h|--help) sed -n '2,9p' "$0"; exit 0 ;;
		*) TAP_FILES+=("$1") ;;
	esac
	shift
done

[ "$DO_DEPS" = 1 ] && install_deps
build_install

WORK="$(pg_owned_dir "$AMR_ROOT/.test-run")"
as_root rm -rf "$WORK/src" "$WORK/regress" "$WORK/isolation" "$WORK/tap"
mkdir -p "$WORK/src"
cp -a "$AMR_ROOT/sql" "$AMR_ROOT/expected" "$AMR_ROOT/specs" "$AMR_ROOT/t" "$AMR_ROOT/test" "$WORK/src/"
mkdir -p "$WORK/src/bench" && cp -a "$AMR_ROOT/bench/data" "$AMR_ROOT/bench/porto_gen.c" "$WORK/src/bench/"
mkdir -p "$WORK/regress" "$WORK/isolation" "$WORK/tap"
as_root chown -R "$AMR_PG_USER" "$WORK"

# Pools on /dev/shm are named after this run (pid and start time: a pid
# alone repeats after a reboot that keeps /dev/shm, and a test that counts
# set-aside pools would count another run's).  Everything under the tag --
# pools, their .grow files and the copies the server set aside as
# .unusable-* -- goes when the run ends; what runs that were killed left
# behind (their runner is gone) goes when the next one starts, since
# /dev/shm is memory.
POOL_TAG="amrtree-test-$$-$(date +%s)"
cleanup() { rm -f /dev/shm/"$POOL_TAG"-* 2>/dev/null || true; }
trap cleanup EXIT
remove_orphaned_pools amrtree-test amrtree-tap

PASSED=0
FAILED=0
FAILED_NAMES=()
record() {	# name status
	if [ "$2" = ok ]; then PASSED=$((PASSED + 1)); else FAILED=$((FAILED + 1)); FAILED_NAMES+=("$1"); fi
}

write_conf() {	# file pool-name
	cat > "$1" <<CONF
shared_preload_libraries = 'amrtree'
amrtree.pmem_path = '/dev/shm/${POOL_TAG}-$2.pool'
amrtree.pmem_size = 256MB
amrtree.dram_size = 16MB
amrtree.ssd_size = 256MB
max_prepared_transactions = 4
log_min_messages = warning
CONF
	chown "$AMR_PG_USER" "$1" 2>/dev/null || true
}

run_core() {
	say "core unit tests (no server)"
	local out="$WORK/core.out" built=0 prog pout
	if make -C "$AMR_ROOT/test/core" -s >"$out" 2>&1; then built=1; fi
	# each program ends with its own "ALL CORE TESTS RAN" line; one missing
	# means that program did not build or did not finish
	for prog in amr_core_test amr_knn_test; do
		pout="$WORK/core-$prog.out"
		: >"$pout"
		if [ "$built" = 1 ]; then "$AMR_ROOT/test/core/$prog" >"$pout" 2>&1 || true; fi
		cat "$pout" >>"$out"
		grep -q '^ALL CORE TESTS RAN' "$pout" || record "core/harness:$prog" fail
	done
	cat "$out"
	while read -r status name; do
		record "core/$name" "$status"
	done < <(grep -E '^(ok|FAIL) ' "$out" | sed -E 's/^(ok|FAIL) (.*)$/\1 \2/')

	# the C sources are laid out as pgindent lays them out
	if command -v pg_bsd_indent >/dev/null 2>&1; then
		if "$AMR_ROOT/scripts/pgindent.sh" --check >"$WORK/pgindent.out" 2>&1; then
			echo "ok style/pgindent"
			record style/pgindent ok
		else
			head -100 "$WORK/pgindent.out"
			echo "FAIL style/pgindent: scripts/pgindent.sh lays these out differently"
			record style/pgindent fail
		fi
	else
		echo "SKIP style/pgindent: pg_bsd_indent is not installed (package pg-bsd-indent)"
	fi
}

# pg_regress and pg_isolation_regress print one line per test:
#   "test name ... ok" / "FAILED", or "ok 1 - name" in newer versions.
tally_regress() {	# suite log
	local suite="$1" log="$2" line name
	while IFS= read -r line; do
		if [[ "$line" =~ ^(test|[[:space:]]*)[[:space:]]*([A-Za-z0-9_-]+)[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed) ]]; then
			name="${BASH_REMATCH[2]}"
			[ "${BASH_REMATCH[3]}" = ok ] && record "$suite/$name" ok || record "$suite/$name" fail
		fi
	done < "$log"
}

run_regress() {
	say "pg_regress (throwaway instance, amrtree preloaded)"
	local tests
	tests=${AMR_REGRESS_TESTS:-$(sed -n 's/^REGRESS_TESTS[[:space:]]*=[[:space:]]*//p' "$AMR_ROOT/test/schedule.mk")}
	if [ -z "${AMR_REGRESS_TESTS:-}" ]; then
		# amrtree_postgis needs PostGIS (installed by install_deps)
		if [ -f "$("$PG_BIN/pg_config" --sharedir)/extension/postgis.control" ]; then
			tests="$tests $(sed -n 's/^POSTGIS_REGRESS_TESTS[[:space:]]*=[[:space:]]*//p' "$AMR_ROOT/test/schedule.mk")"
		else
			echo "SKIP amrtree_postgis: PostGIS is not installed (package postgresql-${PG_MAJOR}-postgis-3)"
		fi
	fi
	write_conf "$WORK/regress/amrtree.conf" regress
	as_pg "$WORK/regress" timeout 900 "$PG_PGXS/src/test/regress/pg_regress" \
		--temp-instance="$WORK/regress/instance" --temp-config="$WORK/regress/amrtree.conf" \
		--bindir="$PG_BIN" --inputdir="$WORK/src" --outputdir="$WORK/regress" \
		--port="$(free_port 55432)" --dbname=contrib_regression $tests \
		> "$WORK/regress/run.log" 2>&1 || true
	cat "$WORK/regress/run.log"
	[ -f "$WORK/regress/regression.diffs" ] && head -200 "$WORK/regress/regression.diffs"
	tally_regress regress "$WORK/regress/run.log"
}

run_isolation() {
	say "isolation tests (throwaway instance, amrtree preloaded)"
	local tests
	tests=${AMR_ISOLATION_TESTS:-$(sed -n 's/^ISOLATION_TESTS[[:space:]]*=[[:space:]]*//p' "$AMR_ROOT/test/schedule.mk")}
	write_conf "$WORK/isolation/amrtree.conf" isolation
	as_pg "$WORK/isolation" timeout 900 "$PG_PGXS/src/test/isolation/pg_isolation_regress" \
		--temp-instance="$WORK/isolation/instance" --temp-config="$WORK/isolation/amrtree.conf" \
		--bindir="$PG_BIN" --inputdir="$WORK/src" --outputdir="$WORK/isolation" \
		--port="$(free_port 56432)" --dbname=isolation_regression $tests \
		> "$WORK/isolation/run.log" 2>&1 || true
	cat "$WORK/isolation/run.log"
	[ -f "$WORK/isolation/regression.diffs" ] && head -200 "$WORK/isolation/regression.diffs"
	tally_regress isolation "$WORK/isolation/run.log"
}

# A short account of a failed TAP file, printed again just before the
# summary (CI shows the end of the output): its failed assertions with
# what they got, and what its servers logged at WARNING or above or about
# a pool they did not trust.
DIGEST=""
digest_tap_failure() {	# file
	local name
	name=$(basename "$1" .pl)
	# (set -e, pipefail: a grep that finds nothing must not end the run)
	DIGEST+="--- $1"$'\n'
	DIGEST+=$(grep -A4 '^#   Failed test' "$WORK/tap/$name.pl.out" | grep -v '^--$' | head -n 24 || true)$'\n'
	DIGEST+=$(grep -HE 'WARNING|ERROR|PANIC|FATAL|is not complete up to|dropped the trees|has no tree|cannot maintain|does not lead to' \
		"$WORK"/tap/tmp_check/log/*"$name"*.log 2>/dev/null | sed "s|^$WORK/tap/tmp_check/log/||" |
		grep -vE 'fault injection|due to administrator command' | head -n 16 || true)$'\n'
}

# One TAP file, in the background: its output goes to <file>.out, and
# "status seconds" to <file>.result for tap_file_report.
tap_file_run() {	# file
	local f="$1" name status started
	name=$(basename "$f")
	started=$SECONDS
	as_pg "$WORK/src" env PATH="$PG_BIN:$PATH" TESTDIR="$WORK/tap" \
		PG_TEST_PORT_DIR="$PG_TEST_PORT_DIR" \
		PG_REGRESS="$PG_PGXS/src/test/regress/pg_regress" \
		AMR_POOL_TAG="$POOL_TAG" AMR_SRC="$WORK/src" \
		timeout 1200 prove -v -I "$PG_PGXS/src/test/perl" -I "$WORK/src/t" "$f" \
		> "$WORK/tap/$name.out" 2>&1 && status=ok || status=fail
	echo "$status $((SECONDS - started))" > "$WORK/tap/$name.result"
}

# Print and record what tap_file_run left for a file that has finished.
tap_file_report() {	# file
	local f="$1" name status took
	name=$(basename "$f")
	read -r status took < "$WORK/tap/$name.result" || { status=fail; took='?'; }
	grep -E '^(ok|not ok|#)|Result:|Failed|Dubious' "$WORK/tap/$name.out" | grep -v '^# Looks' | tail -40 || true
	record "tap/$name" "$status"
	echo "    $f: $status in $took s"
	if [ "$status" != ok ]; then
		echo "--- server logs of $f:"
		tail -n 40 "$WORK"/tap/tmp_check/log/*"$(basename "$f" .pl)"*.log 2>/dev/null || true
		digest_tap_failure "$f"
	fi
}

# The TAP files run AMR_TAP_JOBS at a time (default 2), each reported when
# it ends.  A file spends most of its time starting, stopping, recovering
# and waiting for servers, so two at a time on two CPUs take about 60 % of
# the serial time.  Files share nothing but the machine: each has its own
# data directories (tmp_check), ports (reserved in PG_TEST_PORT_DIR) and
# pool files (AmrTree.pm names them after the file).
run_tap() {
	say "TAP tests"
	local files=("${TAP_FILES[@]}")
	if [ ${#files[@]} -eq 0 ]; then
		mapfile -t files < <(cd "$WORK/src" && ls t/*.pl)
	fi
	local f done_pid jobs=${AMR_TAP_JOBS:-2}
	local -A file_of=()
	[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "AMR_TAP_JOBS must be a positive number, not \"$jobs\"" >&2; exit 2; }
	mkdir -p "$PG_TEST_PORT_DIR" && chmod 1777 "$PG_TEST_PORT_DIR" 2>/dev/null || true
	for f in "${files[@]}" ""; do
		# wait for a free slot (for the last, empty, entry: for every file)
		while [ ${#file_of[@]} -gt 0 ] && { [ -z "$f" ] || [ ${#file_of[@]} -ge "$jobs" ]; }; do
			done_pid=""
			wait -n -p done_pid "${!file_of[@]}" || true
			[ -n "$done_pid" ] || continue
			tap_file_report "${file_of[$done_pid]}"
			unset "file_of[$done_pid]"
		done
		[ -n "$f" ] || break
		f="t/$(basename "$f")"
		tap_file_run "$f" &
		file_of[$!]="$f"
	done
}

[ -z "$ONLY" -o "$ONLY" = core ] && run_core
[ -z "$ONLY" -o "$ONLY" = regress ] && run_regress
[ -z "$ONLY" -o "$ONLY" = isolation ] && run_isolation
[ -z "$ONLY" -o "$ONLY" = tap ] && run_tap

echo
if [ -n "$DIGEST" ]; then
	echo "==> what the failed TAP files reported"
	printf '%s' "$DIGEST"
fi
if [ "$FAILED" -gt 0 ]; then
	echo "failed: ${FAILED_NAMES[*]}"
fi
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]

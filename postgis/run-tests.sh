#!/usr/bin/env bash
# amrtree_postgis's regression test, as scripts/test.sh runs amrtree's:
#   PostGIS (installed with apt-get if missing) -> build (warnings fail)
#   -> install -> pg_regress in a throwaway instance with amrtree preloaded
# amrtree itself must already be installed (scripts/test.sh or "make
# install" at the top level do that).  Prints "SKIP amrtree_postgis: ..."
# and exits 0 where PostGIS cannot be installed.
#
# Usage: postgis/run-tests.sh [--no-deps]
#   --no-deps   do not apt-get PostGIS (skip if it is missing)
# Exit status: 0 passed (or skipped), 1 the test failed, 2 it could not be
# built or run.  AMR_PG_ROOT (see scripts/private-pg.sh) is honoured.

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

PGIS_DIR="$AMR_ROOT/postgis"
POSTGIS_PACKAGE="postgresql-${PG_MAJOR}-postgis-3"
DO_DEPS=1
while [ $# -gt 0 ]; do
	case "$1" in
		--no-deps) DO_DEPS=0 ;;
		-h|--help) sed -n '2,12p' "$0"; exit 0 ;;
		*) echo "unknown argument: $1" >&2; exit 2 ;;
	esac
	shift
done

SHAREDIR="$("$PG_BIN/pg_config" --sharedir)"
PKGLIBDIR="$("$PG_BIN/pg_config" --pkglibdir)"

have_postgis() { [ -f "$SHAREDIR/extension/postgis.control" ]; }

if ! have_postgis && [ "$DO_DEPS" = 1 ]; then
	say "installing $POSTGIS_PACKAGE"
	# a failure here (no network, no such package) means SKIP, not FAIL
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || true
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$POSTGIS_PACKAGE" >/dev/null || true
	if [ -n "$AMR_PG_ROOT" ] && ! have_postgis; then
		echo "note: PostGIS was installed into the system's PostgreSQL, not into AMR_PG_ROOT=$AMR_PG_ROOT (make that copy again with scripts/private-pg.sh)" >&2
	fi
fi
if ! have_postgis; then
	echo "SKIP amrtree_postgis: PostGIS is not installed (package $POSTGIS_PACKAGE; no $SHAREDIR/extension/postgis.control)"
	exit 0
fi
if [ ! -f "$SHAREDIR/extension/amrtree.control" ] || [ ! -f "$PKGLIBDIR/amrtree.so" ]; then
	echo "amrtree is not installed in $PKGLIBDIR: run scripts/test.sh or make install at the top level first" >&2
	exit 2
fi

say "building amrtree_postgis"
log="$(mktemp)"
if ! make -C "$PGIS_DIR" -s PG_CONFIG="$PG_BIN/pg_config" 2>"$log"; then
	cat "$log" >&2; rm -f "$log"; exit 2
fi
if grep -E ': (warning|error):' "$log" >&2; then
	echo "build produced warnings (see above)" >&2; rm -f "$log"; exit 2
fi
rm -f "$log"
say "installing amrtree_postgis into $PKGLIBDIR"
as_root make -C "$PGIS_DIR" -s install PG_CONFIG="$PG_BIN/pg_config" >/dev/null || exit 2

WORK="$(pg_owned_dir "$PGIS_DIR/.test-run")"
as_root rm -rf "$WORK/src" "$WORK/regress"
mkdir -p "$WORK/src" "$WORK/regress"
cp -a "$PGIS_DIR/sql" "$PGIS_DIR/expected" "$WORK/src/"
as_root chown -R "$AMR_PG_USER" "$WORK"

POOL="/dev/shm/amrtree-postgis-test-$$.pool"
cleanup() { rm -f "$POOL" "$POOL".grow 2>/dev/null || true; }
trap cleanup EXIT

cat > "$WORK/regress/amrtree.conf" <<CONF
shared_preload_libraries = 'amrtree'
amrtree.pmem_path = '$POOL'
amrtree.pmem_size = 256MB
amrtree.dram_size = 16MB
amrtree.ssd_size = 256MB
log_min_messages = warning
CONF
chown "$AMR_PG_USER" "$WORK/regress/amrtree.conf" 2>/dev/null || true

say "pg_regress amrtree_postgis (throwaway instance, amrtree preloaded)"
as_pg "$WORK/regress" timeout 900 "$PG_PGXS/src/test/regress/pg_regress" \
	--temp-instance="$WORK/regress/instance" --temp-config="$WORK/regress/amrtree.conf" \
	--bindir="$PG_BIN" --inputdir="$WORK/src" --outputdir="$WORK/regress" \
	--port="$(free_port 57432)" --dbname=contrib_regression amrtree_postgis \
	> "$WORK/regress/run.log" 2>&1 && status=0 || status=1
cat "$WORK/regress/run.log"
[ -f "$WORK/regress/regression.diffs" ] && head -200 "$WORK/regress/regression.diffs"
# pg_regress fails without a per-test line when the instance does not start
if ! grep -Eq 'amrtree_postgis[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed)' "$WORK/regress/run.log"; then
	tail -n 40 "$WORK/regress/log/postmaster.log" 2>/dev/null || true
	exit 2
fi
exit "$status"

#!/usr/bin/env bash
# amrtree end to end on a fresh Debian 12 machine: installs dependencies,
# builds and installs the extension, starts a throwaway cluster under the
# repository (./.demo) with amrtree preloaded, its pool and SSD slot file
# where amrtree puts them by default (files in the data directory; the pool
# is written back in the background), loads 200,000 Porto-like taxi
# boxes, builds an amrtree index with a 30% PMEM budget (and a GiST one to
# compare), runs queries, makes a region hot, restarts, and shows tier
# statistics.
#
# Usage: scripts/demo.sh [--rows N] [--keep] [--no-deps]
#   --keep leaves the cluster running (stop it with the printed command).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROWS=200000
KEEP=0
DO_DEPS=1
while [ $# -gt 0 ]; do
	case "$1" in
		--rows) ROWS="$2"; shift ;;
		--keep) KEEP=1 ;;
		--no-deps) DO_DEPS=0 ;;
		-h|--help) sed -n '2,10p' "$0"; exit 0 ;;
		*) echo "unknown option $1" >&2; exit 2 ;;
	esac
	shift
done

[ "$DO_DEPS" = 1 ] && install_deps
build_install

DEMO="$(pg_owned_dir "$AMR_ROOT/.demo")"
DATA="$DEMO/data"
POOL="$DATA/pg_amrtree/pmem.pool"	# the default; no setting needed
PORT="$(free_port 55500)"

pg() { as_pg "$DEMO" "$PG_BIN/$@"; }
psql_demo() { as_pg "$DEMO" "$PG_BIN/psql" -X -q -h "$DEMO" -p "$PORT" -d postgres -v ON_ERROR_STOP=1 "$@"; }

stop_cluster() {
	[ -f "$DATA/postmaster.pid" ] && pg pg_ctl -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
}
if [ "$KEEP" = 0 ]; then
	trap 'stop_cluster' EXIT
fi

say "throwaway cluster in $DATA (port $PORT), pool at $POOL (amrtree's default)"
stop_cluster
as_root rm -rf "$DATA"
pg initdb -D "$DATA" -A trust -U postgres >/dev/null
cat >> "$DATA/postgresql.conf" <<CONF
shared_preload_libraries = 'amrtree'
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DEMO'
amrtree.pmem_size = 512MB
amrtree.dram_size = 64MB
amrtree.ssd_size = 256MB
CONF
pg pg_ctl -D "$DATA" -l "$DEMO/server.log" -w start >/dev/null
grep 'amrtree:' "$DEMO/server.log" | sed 's/^.*LOG:  /  /'

say "generating $ROWS Porto-like taxi boxes (bench/porto_gen)"
cc -O2 -o "$DEMO/porto_gen" "$AMR_ROOT/bench/porto_gen.c" -lm
"$DEMO/porto_gen" --rows "$ROWS" --seed 42 --format csv > "$DEMO/trips.csv"
chmod a+r "$DEMO/trips.csv"
head -3 "$DEMO/trips.csv" | sed 's/^/  /'

say "loading and indexing"
psql_demo <<SQL
\timing on
CREATE EXTENSION amrtree;
CREATE TABLE trips (id int, mbr box, t float8);
COPY trips FROM '$DEMO/trips.csv' WITH (FORMAT csv);
\echo '-- amrtree build (30% of the leaves may stay on PMEM, the rest goes to SSD):'
CREATE INDEX trips_mbr ON trips USING amrtree (mbr) WITH (pmem_budget = '30%');
\echo '-- GiST build on the same data, for comparison:'
CREATE INDEX trips_mbr_gist ON trips USING gist (mbr);
\timing off
CREATE TABLE gist_size AS SELECT pg_relation_size('trips_mbr_gist') AS bytes;
DROP INDEX trips_mbr_gist;
VACUUM ANALYZE trips;
SQL

say "queries"
psql_demo <<'SQL'
BEGIN;
\echo '-- the query from the README'
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
  SELECT count(*) FROM trips WHERE mbr && box '((-8.62,41.14),(-8.61,41.15))';
SELECT count(*) AS amrtree_rows FROM trips WHERE mbr && box '((-8.62,41.14),(-8.61,41.15))';
SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off; SET LOCAL enable_bitmapscan = off;
SELECT count(*) AS seqscan_rows FROM trips WHERE mbr && box '((-8.62,41.14),(-8.61,41.15))';
RESET enable_indexscan; RESET enable_indexonlyscan; RESET enable_bitmapscan;
\echo '-- every strategy, index vs sequential scan on the same window'
CREATE TEMP TABLE ops (op text);
INSERT INTO ops VALUES ('<<'),('&<'),('&&'),('&>'),('>>'),('~='),('@>'),('<@'),('&<|'),('<<|'),('|>>'),('|&>');
CREATE FUNCTION pg_temp.n(op text, use_index bool) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE c bigint;
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexonlyscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  EXECUTE format('SELECT count(*) FROM trips WHERE mbr %s box ''((-8.615,41.145),(-8.605,41.152))''', op) INTO c;
  RETURN c;
END $$;
SELECT op, pg_temp.n(op, true) AS via_amrtree, pg_temp.n(op, false) AS via_seqscan,
       pg_temp.n(op, true) = pg_temp.n(op, false) AS same
FROM ops;
\echo '-- a large window: the planner measures it on the DRAM tree and scans the table instead'
EXPLAIN (COSTS OFF) SELECT id FROM trips WHERE mbr && box '((-8.7,41.0),(-8.5,41.2))';
ROLLBACK;
SQL

say "inserting 20,000 more rows (each through aminsert), deleting some, VACUUM"
psql_demo <<'SQL'
\timing on
INSERT INTO trips SELECT 1000000 + i,
  box(point(-8.63 + (i % 200) * 0.0002, 41.14 + (i / 200) * 0.0001),
      point(-8.63 + (i % 200) * 0.0002 + 0.0008, 41.14 + (i / 200) * 0.0001 + 0.0005)), 0
FROM generate_series(1, 20000) i;
DELETE FROM trips WHERE id % 10 = 0;
VACUUM trips;
\timing off
SELECT amrtree_check('trips_mbr') AS invariants_hold;
SQL

say "restarting: inner nodes are rebuilt from the Leaf Table on first use"
pg pg_ctl -D "$DATA" -l "$DEMO/server.log" -w restart >/dev/null
psql_demo <<'SQL'
SELECT count(*) AS rows_after_restart FROM trips WHERE mbr && box '((-8.62,41.14),(-8.61,41.15))';
SELECT amrtree_check('trips_mbr') AS invariants_hold_after_restart;
SQL
grep 'rebuilt inner nodes' "$DEMO/server.log" | tail -1 | sed 's/^.*LOG:  /  /'

say "tier statistics (after amrtree_settle: the tier manager's moves are done)"
psql_demo <<'SQL'
SELECT amrtree_settle('trips_mbr', 2) AS leaves_moved_by_settle;
SELECT tier, leaves, pg_size_pretty(bytes) AS bytes, pg_size_pretty(budget_bytes) AS budget
FROM amrtree_tier_stats('trips_mbr');
SELECT * FROM amrtree_migration_stats('trips_mbr');
\echo '-- make one region hot: 50 queries, then let the tier manager react'
SELECT count(*) AS leaves_on_ssd_in_region FROM amrtree_leaf_table('trips_mbr')
WHERE tier = 'ssd' AND mbr && box '((-8.6,41.15),(-8.59,41.16))';
SELECT sum(n) AS rows_seen FROM (SELECT (SELECT count(*) FROM trips WHERE mbr && box '((-8.6,41.15),(-8.59,41.16))') AS n
                                 FROM generate_series(1, 50)) s;
SELECT amrtree_settle('trips_mbr', 1) AS leaves_moved;
SELECT count(*) AS leaves_on_ssd_in_region FROM amrtree_leaf_table('trips_mbr')
WHERE tier = 'ssd' AND mbr && box '((-8.6,41.15),(-8.59,41.16))';
SELECT tier, leaves, pg_size_pretty(bytes) AS bytes, pg_size_pretty(budget_bytes) AS budget
FROM amrtree_tier_stats('trips_mbr');
\x on
SELECT * FROM amrtree_index_stats('trips_mbr');
SELECT pg_size_pretty((SELECT bytes FROM gist_size)) AS gist_size_at_build,
       pg_size_pretty((SELECT dram_bytes + pmem_bytes + ssd_bytes FROM amrtree_index_stats('trips_mbr'))) AS amrtree_size,
       round(100.0 * dram_bytes / greatest(pmem_bytes + ssd_bytes, 1), 2) AS inner_pct_of_leaf_bytes
FROM amrtree_index_stats('trips_mbr');
SELECT * FROM amrtree_pool_stats();
SQL

if [ "$KEEP" = 1 ]; then
	say "cluster left running: psql -h $DEMO -p $PORT postgres   (stop: sudo -u $AMR_PG_USER $PG_BIN/pg_ctl -D $DATA stop)"
else
	say "done; stopping the cluster and removing the pool (use --keep to keep it)"
fi

# Index scans on a hot standby agree with sequential scans in the same
# snapshot while replay splits, rewrites and moves leaves under them.
#
# For 30 s, clients on the primary insert, delete and update rows (moving
# boxes and not, so HOT chains too), with a hot corner that splits leaves
# again and again, while VACUUM and the tier manager (a 25% PMEM budget,
# the SSD cache off) rewrite and move them.  Clients on the standby check, each in
# one REPEATABLE READ transaction, that a plain index scan, an index-only
# scan and a bitmap scan return exactly what a sequential scan returns for
# a random window and strategy (and for a window holding every row), and
# that a KNN scan returns the sequential scan's nearest rows; a check that
# disagrees raises an error, which fails its pgbench run.  The standby runs
# with the fault condition redo:split_unlinked, so every replayed split
# leaves the inner nodes to be packed by the next reader: the path behind
# the wrong rows of t/032's part (b), which this load found first.  With the
# scans of the commit before that fix it fails (a bitmap scan of every row
# came up 18 rows short; at 30 s too).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;
use AmrWal;

my $seconds = $ENV{AMR_PARITY_SECONDS} || 30;
my $primary = amr_node('parityp', init => { allows_streaming => 1 }, conf => q{
autovacuum = off
max_connections = 30
amrtree.ssd_cache_size = 0
amrtree.scan_interval = 100ms
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION amrtree');
$primary->safe_psql('postgres', q{SELECT pg_create_physical_replication_slot('parity')});
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'paritys');
$standby->append_conf('postgresql.conf', q{
primary_slot_name = 'parity'
hot_standby_feedback = on
max_standby_streaming_delay = -1
amrtree.ssd_cache_size = 0
amrtree.fault_injection = 'redo:split_unlinked'
});
$standby->start;

$primary->safe_psql('postgres', q{
CREATE TABLE t (id bigserial PRIMARY KEY, b box, pad int) WITH (fillfactor = 90);
INSERT INTO t (b, pad)
SELECT box(point(x, y), point(x + random() * 0.004, y + random() * 0.003)), 0
FROM (SELECT random() * 1.2 AS x, random() * 0.9 AS y FROM generate_series(1, 40000)) s;
INSERT INTO t (b) SELECT NULL FROM generate_series(1, 300);
CREATE INDEX t_b ON t USING amrtree (b) WITH (pmem_budget = '25%');
VACUUM ANALYZE t;
});
amr_setup_snapshot_checks($primary);
$primary->wait_for_catchup($standby);

my %writers = (
	write => [ q{
\set x random(0, 1200)
\set y random(0, 900)
\set id random(1, 40000)
INSERT INTO t (b, pad) SELECT box(point(:x * 0.001 + random() * 0.01, :y * 0.001 + random() * 0.01),
  point(:x * 0.001 + 0.01 + random() * 0.004, :y * 0.001 + 0.01 + random() * 0.003)), 1 FROM generate_series(1, 10);
DELETE FROM t WHERE id BETWEEN :id AND :id + 10;
UPDATE t SET b = box(point(:x * 0.001, :y * 0.001), point(:x * 0.001 + 0.002, :y * 0.001 + 0.002)) WHERE id BETWEEN :id + 100 AND :id + 105;
UPDATE t SET pad = pad + 1 WHERE id BETWEEN :id + 200 AND :id + 205;
}, 1 ],
	# two clients delete in overlapping regions: SKIP LOCKED, or each may
	# wait for a row the other deleted first (a deadlock failed a run)
	hot => [ q{
\set x random(0, 100)
\set y random(0, 80)
INSERT INTO t (b, pad) SELECT box(point(0.6 + :x * 0.00001 + random() * 0.0001, 0.4 + :y * 0.00001),
  point(0.6 + :x * 0.00001 + 0.0002, 0.4 + :y * 0.00001 + 0.0002)), 2 FROM generate_series(1, 10);
DELETE FROM t WHERE id IN (SELECT id FROM t WHERE b && box(point(0.6 + :y * 0.00001, 0.4 + :x * 0.00001),
  point(0.6 + :y * 0.00001 + 0.0001, 0.4 + :x * 0.00001 + 0.0001)) AND pad = 2 LIMIT 8 FOR UPDATE SKIP LOCKED);
}, 2 ],
	vacuum => [ "VACUUM t;\n", 1 ],);
my %checkers = (
	window => [ q{
\set x random(0, 1200)
\set y random(0, 900)
\set s random(1, 40)
\set o random(0, 11)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT amr_check_window('t', box(point(:x * 0.001, :y * 0.001), point(:x * 0.001 + :s * 0.0005, :y * 0.001 + :s * 0.0004)),
  (ARRAY['&&', '&&', '&&', '@>', '<@', '~=', '<<', '&<', '&>', '>>', '<<|', '|&>'])[:o + 1]);
COMMIT;
}, 3 ],
	hot_window => [ q{
\set x random(0, 100)
\set y random(0, 80)
\set s random(1, 40)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT amr_check_window('t', box(point(0.6 + :x * 0.00001, 0.4 + :y * 0.00001),
  point(0.6 + :x * 0.00001 + :s * 0.00005, 0.4 + :y * 0.00001 + :s * 0.00004)), '&&');
COMMIT;
}, 3 ],
	# every leaf, each read while replay splits others
	everything => [ q{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT amr_check_window('t', box '((-1,-1),(2,2))', '&&');
COMMIT;
}, 3 ],
	nearest => [ q{
\set x random(0, 1200)
\set y random(0, 900)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT amr_check_nearest('t', point(:x * 0.001, :y * 0.001));
COMMIT;
}, 1 ],);

my $leaves0 = $primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_index_stats('t_b')});
my $write = amrwal_start_load($primary, scripts => \%writers, clients => 2, seconds => $seconds);
my $check = amrwal_start_load($standby, scripts => \%checkers, clients => 3, seconds => $seconds);
sleep $seconds;
my $w = amrwal_stop_load($write);
my $c = amrwal_stop_load($check);
amrwal_load_ok($w, 'writes, splits and VACUUM on the primary');
amrwal_load_ok($c, 'standby checks: every index scan agreed with the sequential scan in its snapshot', 100);

cmp_ok($primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_index_stats('t_b')}),
	'>', $leaves0 + 20, 'leaves split meanwhile');
cmp_ok($primary->safe_psql('postgres', q{SELECT promotions + demotions FROM amrtree_migration_stats('t_b')}),
	'>', 0, 'the tier manager moved leaves meanwhile');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'amrtree_check on the standby');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'amrtree_check on the primary');

done_testing();

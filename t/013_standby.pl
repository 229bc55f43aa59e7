# amrtree on streaming hot standbys (WAL logging).
#
# (a) A standby made by pg_basebackup while pgbench inserts on the primary,
#     with the pool and the slot file at their defaults inside the data
#     directory (so the backup copies them, in whatever state they were
#     while it ran).  After catch-up the standby answers amrtree index
#     scans and bitmap scans exactly as its own sequential scans and exactly
#     as the primary does, for every strategy, through inserts that split
#     leaves (with readers on the standby meanwhile), DELETE + VACUUM, tier
#     migrations, a budget change, a new index, REINDEX and REINDEX
#     CONCURRENTLY on the primary; its planner picks the index; promotion
#     needs no REINDEX, and the promoted server takes writes.
# (b) A standby from the same backup whose pool and slot file are new
#     (outside the data directory, not copies): an index built before it
#     started has no tree there, and a forced index scan says so with an
#     ERROR while the planner leaves the index alone; an index created (or
#     rebuilt) on the primary after it started works there.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;
use AmrWal;

my $started = time;
my $rows = 40000;

# pool and slot file at their defaults, inside the data directory
my $primary = amrwal_primary('primary', rows => $rows, seed => 13);
amrwal_setup($primary);
amrwal_windows($primary, 'trips', 80);
$primary->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});
cmp_ok($primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('trips_b') WHERE tier = 'ssd'}),
	'>', 0, 'with a 50% budget some leaves are on the SSD tier');
my ($mismatch, $info) = amrwal_parity($primary, 'trips');
is($mismatch, 0, "primary: index agrees with a sequential scan before the backup ($info)");

my %scripts = (
	ins => q{
\set x random(0, 12000)
\set y random(0, 8500)
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.688 + :x * 0.00001, 41.098 + :y * 0.00001),
  point(-8.688 + :x * 0.00001 + random() * 0.002, 41.098 + :y * 0.00001 + random() * 0.0015)), 0;
},
	# a small region, so that its leaves split again and again
	hot => q{
\set x random(0, 1000)
\set y random(0, 800)
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.615 + :x * 0.00001, 41.145 + :y * 0.00001),
  point(-8.615 + :x * 0.00001 + random() * 0.0005, 41.145 + :y * 0.00001 + random() * 0.0004)), 0;
},
	# readers on the standby, forced onto the index, while it replays
	rd_index => q{
\set x random(0, 1200)
\set y random(0, 850)
BEGIN;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT id, b FROM trips WHERE b && box(point(-8.688 + :x * 0.0001, 41.098 + :y * 0.0001),
  point(-8.688 + :x * 0.0001 + 0.004, 41.098 + :y * 0.0001 + 0.003));
COMMIT;
},
	rd_hot => q{
\set x random(0, 1000)
\set y random(0, 800)
BEGIN;
SET LOCAL enable_seqscan = off;
SELECT count(*) FROM trips WHERE b && box(point(-8.615 + :x * 0.00001, 41.145 + :y * 0.00001),
  point(-8.615 + :x * 0.00001 + 0.001, 41.145 + :y * 0.00001 + 0.001));
COMMIT;
},
);
sub scripts { my %s; $s{$_} = [ $scripts{$_}, 1 ] for @_; return \%s; }

# ---------------------------------------------------------------------------
# base backup under load; two standbys from it
my $load = amrwal_start_load($primary, scripts => scripts('ins'), seconds => 2);
sleep 1;
$primary->backup('b1');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b1', has_streaming => 1);
$standby->start;

# (b): same backup, but a new pool and slot file, not the backup's copies
my $standby2 = amr_standby_own_pool($primary, 'b1', 'standby2');
my $pool2 = amr_pool_path('standby2');
$standby2->start;

sleep 2;
amrwal_load_ok(amrwal_stop_load($load), 'inserts during the base backup');
ok(-f $primary->backup_dir . '/b1/pg_amrtree/pmem.pool' && -f $primary->backup_dir . '/b1/pg_amrtree/ssd.slots',
	'the base backup holds a copy of the pool and the slot file');
ok(-f $pool2, 'standby2 made its own pool outside the data directory');

# Compare a standby with the primary after catch-up, the load stopped:
# the heaps agree, the standby's index agrees with its sequential scans
# (plain and bitmap index scans; the selective strategies && @> <@ ~= on
# every window, all twelve on every 20th window, or every 4th with
# all_every => 4: every strategy on every window would take half a minute
# per check) and with the primary's index, and its tree passes
# amrtree_check and has the primary's shape.
sub compare
{
	my ($what, $node, $pairs, %o) = @_;
	my $name = $node->name;
	ok(amrwal_catchup($primary, $node), "$what: $name caught up with the primary")
	  or die "$name did not catch up";
	for my $pair (@$pairs)
	{
		my ($table, $index) = @$pair;
		amrwal_same_digest(amrwal_heap_digest($node, $table), amrwal_heap_digest($primary, $table),
			"$what: $name: $table: the heap agrees with the primary's");
		my ($m, $i, $seq, $idx) = amrwal_parity($node, $table, %o);
		is($m, 0, "$what: $name: $table: index and bitmap scans agree with a sequential scan ($i)");
		amrwal_same_digest($idx, amrwal_digest($primary, $table, 'index', %o),
			"$what: $name: $table: index results equal the primary's");
		is(amrwal_check($node, $index), 't', "$what: $name: amrtree_check('$index')");
		is(amrwal_shape($node, $index), amrwal_shape($primary, $index),
			"$what: $name: $index has the primary's leaves and entries");
	}
}

compare('after the base backup', $standby, [ [ 'trips', 'trips_b' ] ], all_every => 4);
like($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), qr/^t$/, 'the standby is in recovery');

# (b) the standby whose pool is not a copy
ok(amrwal_catchup($primary, $standby2), 'standby2 caught up with the primary') or die;
my $small = q{box '((-8.612,41.150),(-8.609,41.1525))'};
my ($ret, $out, $err) = $standby2->psql('postgres', "SET enable_seqscan = off; SELECT count(*) FROM trips WHERE b && $small");
is($ret, 0, 'standby2: with enable_seqscan = off, a query on an index built before the standby started answers: the planner skips the index');
is($out, $primary->safe_psql('postgres', "SELECT count(*) FROM trips WHERE b && $small"), '... with the primary\'s count');
($ret, $out, $err) = $standby2->psql('postgres', "SELECT amrtree_check('trips_b')");
like($err, qr/ERROR:  amrtree index "\w+" has no tree/, '... and reading the index itself says it has no tree');
like($err, qr/pool/i, '... mentioning the pool');
my $ids = "SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM trips WHERE b && $small";
my $want = $primary->safe_psql('postgres', $ids);
is(amrwal_query($standby2, $ids), $want, 'standby2: the same query, planner free, returns the primary\'s rows');
unlike(amrwal_explain($standby2, "SELECT id FROM trips WHERE b && $small"), qr/trips_b/,
	'standby2: the planner leaves the index without a tree alone');
like(amrwal_explain($primary, "SELECT id FROM trips WHERE b && $small"), qr/(Index|Index Only|Bitmap Index) Scan .*trips_b/,
	'(the primary\'s planner uses the index for that query)');

# ---------------------------------------------------------------------------
# inserts that split leaves, with readers on the standby meanwhile
my $migrations0 = $primary->safe_psql('postgres', q{SELECT promotions + demotions FROM amrtree_migration_stats('trips_b')});
my $leaves0 = $primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_index_stats('trips_b')});
my $writers = amrwal_start_load($primary, scripts => scripts('ins', 'hot'), seconds => 1);
my $readers = amrwal_start_load($standby, scripts => scripts('rd_index', 'rd_hot'), seconds => 1);
$primary->safe_psql('postgres', q{
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.61 + (g % 60) * 0.00005, 41.15 + (g / 60) * 0.00005),
  point(-8.61 + (g % 60) * 0.00005 + 0.00003, 41.15 + (g / 60) * 0.00005 + 0.00003)), 0
FROM generate_series(1, 3000) g;});
sleep 4;
amrwal_load_ok(amrwal_stop_load($writers), 'inserts on the primary');
my $r = amrwal_stop_load($readers);
amrwal_load_ok($r, 'index scans on the standby while it replays the inserts', 20);
cmp_ok($primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_index_stats('trips_b')}),
	'>', $leaves0 + 30, 'leaves split on the primary');
compare('after splits', $standby, [ [ 'trips', 'trips_b' ] ]);

# DELETE + VACUUM (leaves rewritten)
my $entries0 = $primary->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('trips_b')});
$primary->safe_psql('postgres', q{DELETE FROM trips WHERE id % 5 = 0 OR (id > 1000000 AND id % 3 = 0)});
$primary->safe_psql('postgres', q{VACUUM (INDEX_CLEANUP ON) trips});
cmp_ok($primary->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('trips_b')}),
	'<', $entries0 - 5000, 'VACUUM removed the deleted rows\' entries on the primary');
compare('after DELETE and VACUUM', $standby, [ [ 'trips', 'trips_b' ] ]);

# tier migrations: the new and rewritten leaves went to PMEM, over budget;
# the tier manager (every second) or amrtree_settle moves them
my $moved = $primary->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});
my $migrations = $primary->safe_psql('postgres', q{SELECT promotions + demotions FROM amrtree_migration_stats('trips_b')});
cmp_ok($migrations, '>', $migrations0, 'leaves migrated between the tiers since the backup ('
	  . ($migrations - $migrations0) . ", $moved by amrtree_settle)");
compare('after amrtree_settle', $standby, [ [ 'trips', 'trips_b' ] ]);

my $ssd0 = $primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('trips_b') WHERE tier = 'ssd'});
$primary->safe_psql('postgres', q{ALTER INDEX trips_b SET (pmem_budget = '20%')});
$moved = $primary->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});
cmp_ok($primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('trips_b') WHERE tier = 'ssd'}),
	'>', $ssd0, "a 20% budget moved $moved leaves, more of them to the SSD tier");
compare('after pmem_budget 20% and amrtree_settle', $standby, [ [ 'trips', 'trips_b' ] ]);

# the standby's planner picks the index, as the primary's does
$primary->safe_psql('postgres', 'ANALYZE trips');
amrwal_catchup($primary, $standby) or die;
my $q = "SELECT id FROM trips WHERE b && $small";
like(amrwal_explain($primary, $q), qr/(Index|Index Only|Bitmap Index) Scan .*trips_b/, 'primary: EXPLAIN uses trips_b');
like(amrwal_explain($standby, $q), qr/(Index|Index Only|Bitmap Index) Scan .*trips_b/, 'standby: EXPLAIN uses trips_b')
  or diag(amrwal_explain($standby, $q));
is(amrwal_query($standby, $ids), $primary->safe_psql('postgres', $ids), 'standby: and returns the primary\'s rows');

# ---------------------------------------------------------------------------
# an index created after the standbys started, then REINDEX
amr_load_porto($primary, 'late', 15000, 17);
$primary->safe_psql('postgres', q{
CREATE INDEX late_b ON late USING amrtree (b) WITH (pmem_budget = '30%');
ANALYZE late;});
$primary->safe_psql('postgres', q{SELECT amrtree_settle('late_b', 0)});
compare('new index', $standby, [ [ 'late', 'late_b' ] ]);
compare('new index', $standby2, [ [ 'late', 'late_b' ] ]);
is($standby2->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('trips_b')}), 'no tree',
	'standby2: trips_b still has no tree');

$primary->safe_psql('postgres', q{
INSERT INTO late SELECT id + 100000, b, t FROM late WHERE id % 4 = 0;
DELETE FROM late WHERE id % 7 = 0;
VACUUM late;});
$primary->safe_psql('postgres', 'REINDEX INDEX trips_b');
$primary->safe_psql('postgres', 'REINDEX INDEX CONCURRENTLY late_b');
compare('after REINDEX and REINDEX CONCURRENTLY', $standby, [ [ 'trips', 'trips_b' ], [ 'late', 'late_b' ] ]);
compare('after REINDEX and REINDEX CONCURRENTLY', $standby2, [ [ 'trips', 'trips_b' ], [ 'late', 'late_b' ] ]);
$standby2->stop;

# ---------------------------------------------------------------------------
# promotion: no REINDEX, writes work
my $log_at = -s $standby->logfile;
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'promotion did not finish';
is(amrwal_query($standby, q{
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.64 + (g % 50) * 0.0002, 41.13 + (g / 50) * 0.0002),
  point(-8.64 + (g % 50) * 0.0002 + 0.0001, 41.13 + (g / 50) * 0.0002 + 0.0001)), 0
FROM generate_series(1, 2500) g;
INSERT INTO late SELECT id + 200000, b, t FROM late WHERE id % 5 = 0;
DELETE FROM trips WHERE id % 11 = 0;
DELETE FROM late WHERE id % 13 = 0;
VACUUM trips;
VACUUM late;}), '', 'promoted: INSERT, DELETE and VACUUM succeed');
for my $pair ([ 'trips', 'trips_b' ], [ 'late', 'late_b' ])
{
	my ($table, $index) = @$pair;
	($mismatch, $info) = amrwal_parity($standby, $table, all_every => 4);
	is($mismatch, 0, "promoted: $table: index agrees with a sequential scan after writes ($info)");
	is(amrwal_check($standby, $index), 't', "promoted: amrtree_check('$index')");
}
ok(!$standby->log_contains('dropped the trees', $log_at) && !$standby->log_contains('has no tree', $log_at),
	'promoted: no tree was dropped, none is missing');
$moved = amrwal_query($standby, q{ALTER INDEX trips_b SET (pmem_budget = '60%'); SELECT amrtree_settle('trips_b', 0)});
like($moved, qr/^\d+$/, "promoted: amrtree_settle works ($moved leaves moved)");
$standby->restart;
($mismatch, $info) = amrwal_parity($standby, 'trips');
is($mismatch, 0, "promoted, restarted: index agrees with a sequential scan ($info)");
is(amrwal_check($standby, 'trips_b'), 't', 'promoted, restarted: amrtree_check');
my ($reindexes) = grep { /statement: REINDEX/i } split /\n/, slurp_file($standby->logfile);
ok(!defined $reindexes, 'no REINDEX ran on the standby or the promoted server');

# the primary carries on
($mismatch, $info) = amrwal_parity($primary, 'trips');
is($mismatch, 0, "primary at the end: index agrees with a sequential scan ($info)");
is(amrwal_check($primary, 'trips_b'), 't', 'primary at the end: amrtree_check');

$standby->stop;
$primary->stop;
note sprintf('%.0f s', time - $started);
done_testing();

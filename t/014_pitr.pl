# Archive recovery with amrtree indexes (WAL logging): a base backup taken
# while clients insert and delete, the pool and slot file at their defaults
# inside the data directory (so the backup copies them while they change),
# then WAL archived through inserts that split leaves, DELETE + VACUUM, tier
# migrations, a budget change and a new index.  Restored
#
#  A: to a named restore point (recovery_target_name, then promote): every
#     strategy returns through the index exactly what a sequential scan
#     returns there, and exactly what the primary returned at the restore
#     point; and
#  B: to the end of the archived WAL: the same against the primary's final
#     state, including the index created after the restore point.
#
# Neither needs REINDEX, amrtree_check holds on both, and both take inserts
# afterwards.
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

my $primary = amrwal_primary('primary', archiving => 1, rows => 30000, seed => 14);
amrwal_setup($primary);
amrwal_windows($primary, 'trips', 100);
$primary->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});
my ($mismatch, $info) = amrwal_parity($primary, 'trips');
is($mismatch, 0, "primary: index agrees with a sequential scan before the backup ($info)");

# base backup while two clients insert and delete
my $load = amrwal_start_load($primary, seconds => 2, scripts => amrwal_scripts(ins => 4, del => 1));
sleep 1;
$primary->backup('b1');
sleep 1;
amrwal_load_ok(amrwal_stop_load($load), 'inserts and deletes during the base backup');

# changes up to the restore point: splits, DELETE + VACUUM, migrations
$primary->safe_psql('postgres', q{
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.61 + (g % 50) * 0.00005, 41.15 + (g / 50) * 0.00005),
  point(-8.61 + (g % 50) * 0.00005 + 0.00003, 41.15 + (g / 50) * 0.00005 + 0.00003)), 0
FROM generate_series(1, 2500) g;
DELETE FROM trips WHERE id % 6 = 0;
VACUUM trips;
ALTER INDEX trips_b SET (pmem_budget = '25%');});
$primary->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});
$primary->safe_psql('postgres', q{SELECT pg_create_restore_point('rp1')});

# what the primary returns at the restore point (nothing runs meanwhile)
my %rp1 = (
	heap => amrwal_heap_digest($primary, 'trips'),
	seq => amrwal_digest($primary, 'trips', 'seq', all_every => 4),
	shape => amrwal_shape($primary, 'trips_b'));
amrwal_same_digest(amrwal_digest($primary, 'trips', 'index', all_every => 4), $rp1{seq},
	'primary at rp1: index results equal a sequential scan');

# changes after it: more splits elsewhere, DELETE + VACUUM, a new index,
# another budget
$primary->safe_psql('postgres', q{
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.65 + (g % 50) * 0.00005, 41.12 + (g / 50) * 0.00005),
  point(-8.65 + (g % 50) * 0.00005 + 0.00003, 41.12 + (g / 50) * 0.00005 + 0.00003)), 0
FROM generate_series(1, 2500) g;
DELETE FROM trips WHERE id % 7 = 0;
VACUUM trips;
ALTER INDEX trips_b SET (pmem_budget = '70%');});
$primary->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});
amr_load_porto($primary, 'late', 10000, 15);
$primary->safe_psql('postgres', q{
CREATE INDEX late_b ON late USING amrtree (b) WITH (pmem_budget = '30%');
DELETE FROM late WHERE id % 9 = 0;
VACUUM late;});
my %final = (
	heap => amrwal_heap_digest($primary, 'trips'),
	seq => amrwal_digest($primary, 'trips', 'seq', all_every => 4),
	shape => amrwal_shape($primary, 'trips_b'),
	late_heap => amrwal_heap_digest($primary, 'late'),
	late_seq => amrwal_digest($primary, 'late', 'seq', all_every => 4),
	late_shape => amrwal_shape($primary, 'late_b'));
isnt($final{heap}, $rp1{heap}, 'the data changed after rp1');
amrwal_same_digest(amrwal_digest($primary, 'trips', 'index', all_every => 4), $final{seq},
	'primary at the end: index results equal a sequential scan');

my $walfile = $primary->safe_psql('postgres', 'SELECT pg_walfile_name(pg_current_wal_lsn())');
$primary->safe_psql('postgres', 'SELECT pg_switch_wal()');
$primary->poll_query_until('postgres', "SELECT last_archived_wal >= '$walfile' FROM pg_stat_archiver")
  or die 'the last WAL segment was not archived';
$primary->stop;

# Restore the backup with the archive; the restored servers must not
# archive into the primary's archive (a timeline-2 history file there would
# send the next restore down the other server's timeline).
sub restore
{
	my ($name, $conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init_from_backup($primary, 'b1', has_restoring => 1, standby => 0);
	$node->append_conf('postgresql.conf', "archive_mode = off\n$conf");
	$node->start;
	$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
	  or die "$name: recovery did not end";
	return $node;
}

# Index against sequential scans, against the primary's digests, amrtree_check,
# shape, then inserts.
sub verify
{
	my ($node, $what, $table, $index, $want_heap, $want_seq, $want_shape) = @_;
	amrwal_same_digest(amrwal_heap_digest($node, $table), $want_heap, "$what: $table holds the primary's rows");
	amrwal_same_digest(amrwal_digest($node, $table, 'seq', all_every => 4), $want_seq,
		"$what: $table: sequential scans return what the primary returned");
	my ($m, $i, $seq, $idx) = amrwal_parity($node, $table, all_every => 4);
	is($m, 0, "$what: $table: index and bitmap scans agree with a sequential scan ($i)");
	amrwal_same_digest($idx, $want_seq, "$what: $table: index results equal the primary's");
	is(amrwal_check($node, $index), 't', "$what: amrtree_check('$index')");
	is(amrwal_shape($node, $index), $want_shape, "$what: $index has the primary's leaves and entries");
	is(amrwal_query($node, qq{
INSERT INTO $table (id, b, t)
SELECT 5000000 + g, box(point(-8.62 + (g % 40) * 0.0001, 41.14 + (g / 40) * 0.0001),
  point(-8.62 + (g % 40) * 0.0001 + 0.00005, 41.14 + (g / 40) * 0.0001 + 0.00005)), 0
FROM generate_series(1, 1500) g;
DELETE FROM $table WHERE id % 13 = 0;
VACUUM $table;}), '', "$what: $table takes inserts, deletes and VACUUM");
	($m, $i) = amrwal_parity($node, $table);
	is($m, 0, "$what: $table: after them, index agrees with a sequential scan ($i)");
	is(amrwal_check($node, $index), 't', "$what: amrtree_check('$index') after them");
}

my $a = restore('pitr_rp1', "recovery_target_name = 'rp1'\nrecovery_target_action = 'promote'\n");
ok($a->log_contains('recovery stopping at restore point "rp1"'), 'A: recovery stopped at rp1');
is($a->safe_psql('postgres', q{SELECT to_regclass('late') IS NULL}), 't', 'A: the table created after rp1 is not there');
verify($a, 'A (rp1)', 'trips', 'trips_b', $rp1{heap}, $rp1{seq}, $rp1{shape});
ok(!$a->log_contains('dropped the trees') && !$a->log_contains('has no tree'), 'A: no tree was dropped, none is missing');
$a->stop;

my $b = restore('pitr_end', '');
verify($b, 'B (end of WAL)', 'trips', 'trips_b', $final{heap}, $final{seq}, $final{shape});
verify($b, 'B (end of WAL)', 'late', 'late_b', $final{late_heap}, $final{late_seq}, $final{late_shape});
ok(!$b->log_contains('dropped the trees') && !$b->log_contains('has no tree'), 'B: no tree was dropped, none is missing');
$b->restart;
($mismatch, $info) = amrwal_parity($b, 'trips');
is($mismatch, 0, "B, restarted: index agrees with a sequential scan ($info)");
$b->stop;

note sprintf('%.0f s', time - $started);
done_testing();

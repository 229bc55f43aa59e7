# A hot standby's pool file put back from an older copy while the server
# was stopped.  A write-back pool written by WAL replay is synced only now
# and then, and a start on the same boot trusted the file whatever its
# header said (the page cache had kept replay's writes); so an older copy
# of it, or the base backup's copy, was taken for the file replay wrote,
# replay resumed at the last restartpoint, and the changes between the copy
# and the restartpoint were missing: index scans came up short of
# sequential scans.
#
# Now a clean stop of the standby syncs the file and records how far it is
# complete (amr_writeback.c, wb_recovery_at_exit), a start after a clean
# stop checks that position against the redo pointer, and a pool that fails
# is left out by the standby's queries until promotion rebuilds its indexes
# (amr_walredo.c, amr_redo_startup).
#
#  1. The standby is stopped cleanly and restarted with its own file: the
#     file is trusted, the index is used at once and agrees with a
#     sequential scan.
#  2. A copy of the file taken while the standby was stopped is put back
#     after replay went on past a restartpoint: the log says the file is not
#     complete, queries leave the index out and return the primary's rows.
#  3. Promoted, the standby rebuilds the index, which then agrees with a
#     sequential scan.
use strict;
use warnings;
use File::Copy qw(copy);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;
use AmrWal;

# pool and slot file at their defaults, inside the data directory
my $primary = amrwal_primary('primary', rows => 20000, seed => 35);
amrwal_setup($primary);
amrwal_windows($primary, 'trips', 40);
$primary->backup('b1');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b1', has_streaming => 1);
$standby->start;
ok(amrwal_catchup($primary, $standby), 'the standby caught up') or die;

my $pool = $standby->data_dir . '/pg_amrtree/pmem.pool';
my $small = q{box '((-8.612,41.150),(-8.609,41.1525))'};
# EXPLAIN with sequential scans off: an index the planner leaves out still
# gives a sequential scan
sub plan
{
	my ($node) = @_;
	my $r = amrwal_query($node, "SET enable_seqscan = off; EXPLAIN (COSTS OFF) SELECT id FROM trips WHERE b && $small");
	$r =~ s/\n/ | /g;
	return $r;
}
my $ids = "SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM trips WHERE b && $small";

# the primary's changes, replayed into the standby's pool, and a
# restartpoint after them
sub change
{
	my ($seed) = @_;
	$primary->safe_psql('postgres', qq{
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.62 + (g % 70) * 0.0002, 41.145 + (g / 70) * 0.0001),
  point(-8.62 + (g % 70) * 0.0002 + 0.0001, 41.145 + (g / 70) * 0.0001 + 0.0001)), $seed
FROM generate_series(1, 3000) g;
DELETE FROM trips WHERE id % 3 = $seed % 3;});
	$primary->safe_psql('postgres', 'VACUUM trips');
	$primary->safe_psql('postgres', 'CHECKPOINT');
	amrwal_catchup($primary, $standby) or die;
	$standby->safe_psql('postgres', 'CHECKPOINT');
}

# 1. a clean restart with the standby's own file
change(1);
$standby->stop('fast');
my $log_at = -s $standby->logfile;
$standby->start;
ok(!$standby->log_contains('is not complete up to', $log_at), '1: a clean restart trusts the file replay wrote');
like(plan($standby), qr/(Index|Index Only|Bitmap Index) Scan .*trips_b/,
	'1: the standby uses the index');
my ($m, $info) = amrwal_parity($standby, 'trips');
is($m, 0, "1: index and bitmap scans agree with a sequential scan ($info)");

# 2. an older copy of the file put back
$standby->stop('fast');
copy($pool, "$pool.old") or die "copy: $!";
$standby->start;
change(2);
$standby->stop('fast');
copy("$pool.old", $pool) or die "copy: $!";
unlink "$pool.old";
$log_at = -s $standby->logfile;
$standby->start;
ok($standby->log_contains('is not complete up to the WAL position recovery starts from', $log_at),
	'2: the older copy is found not complete up to where replay resumes');
ok(amrwal_catchup($primary, $standby), '2: the standby caught up') or die;
unlike(plan($standby), qr/trips_b/,
	'2: the standby leaves the index out');
is(amrwal_query($standby, "SET enable_seqscan = off; $ids"), $primary->safe_psql('postgres', $ids),
	'2: a query that would rather use the index returns the primary\'s rows');
($m, $info) = amrwal_parity($standby, 'trips');
like($m, qr/^ERROR: .*amrtree index not used/s, '2: no index scan can be forced onto the index');

# 3. promoted, the index is rebuilt
$standby->promote;
$standby->poll_query_until('postgres', q{SELECT status = 'ok' FROM amrtree_index_stats('trips_b')})
  or die 'the index was not rebuilt';
($m, $info) = amrwal_parity($standby, 'trips');
is($m, 0, "3: promoted: the rebuilt index agrees with a sequential scan ($info)");
is(amrwal_check($standby, 'trips_b'), 't', '3: amrtree_check');

$standby->stop;
$primary->stop;
done_testing();

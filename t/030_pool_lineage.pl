# A pool outside the data directory outlives it.  When a data directory is
# put back to an earlier state -- restored in place from a base backup with
# point-in-time recovery, restored from a copy taken while it was stopped,
# rewound by pg_rewind after a failover -- the pool left at its
# amrtree.pmem_path holds what the server's later life did: entries VACUUM
# removed there are missing although their rows are back.  The pool records
# its WAL extent (the latest record whose change it may hold), and a server
# whose WAL does not lead there gives the pool up and rebuilds its indexes
# instead of answering from it.
#
# For each kind of pool outside the data directory -- a written-back file on
# disk (the default persistence) and a /dev/shm pool (stores flushed at
# once) -- the test checks
#   - that a clean restart and a crash keep the pool (no false alarm);
#   - an in-place PITR restore of a base backup to a restore point made
#     before the later life deleted and vacuumed a third of the rows;
#   - an in-place restore of a copy of the stopped data directory, once
#     after logged changes and once after changes to an unlogged table
#     only (they have no records);
# each time: the server log names the pool from another life, the indexes
# are rebuilt, and every strategy through the index agrees with a
# sequential scan.  Then, on disk: a failover where the old primary, rewound
# with pg_rewind, starts as a standby on its leftover pool: replay gives the
# pool up at once (the target timeline branched off before its extent), the
# standby's queries leave the index out, and after promotion it is rebuilt.
use strict;
use warnings;
use File::Path qw(rmtree);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::RecursiveCopy;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;
use AmrWal;

my $other_life = qr/holds changes this data directory's WAL does not lead to/;

# A primary whose pool is $pool (outside its data directory), with trips
# and an amrtree index.
sub lineage_primary
{
	my ($name, $pool) = @_;
	my $node = amr_node($name, pool => $pool, pmem_size => '64MB',
		init => { allows_streaming => 1, has_archiving => 1 },
		conf => q{
amrtree.ssd_size = 32MB
autovacuum = off
shared_buffers = 16MB
wal_log_hints = on
wal_keep_size = 256MB
});
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE SEQUENCE trip_ids START 1000000');
	amr_load_porto($node, 'trips', 12000, 30);
	$node->safe_psql('postgres', q{
CREATE INDEX trips_b ON trips USING amrtree (b);
VACUUM ANALYZE trips;});
	amrwal_setup($node);
	amrwal_windows($node, 'trips', 60);
	return $node;
}

# What the later life does: removals the earlier state must not lose.
sub later_life
{
	my ($node, $k) = @_;
	$node->safe_psql('postgres', qq{
DELETE FROM trips WHERE id % 3 = $k;
VACUUM trips;
INSERT INTO trips SELECT nextval('trip_ids'), box(point((b[0])[0] + 0.0003, (b[0])[1]), point((b[1])[0] + 0.0003, (b[1])[1])), t
  FROM trips WHERE id % 11 = 4;
CHECKPOINT;});
}

# Put the data directory back to the copy in $from.
sub restore_in_place
{
	my ($node, $from) = @_;
	my $conf = slurp_file($node->data_dir . '/postgresql.conf');
	rmtree($node->data_dir);
	PostgreSQL::Test::RecursiveCopy::copypath($from, $node->data_dir);
	chmod(0700, $node->data_dir);
	open(my $fh, '>', $node->data_dir . '/postgresql.conf') or die $!;
	print $fh $conf;
	close $fh;
}

sub log_since
{
	my ($node, $at) = @_;
	return substr(slurp_file($node->logfile), $at);
}

# After a start on a pool from another life: said so, rebuilt, right rows
# (in $table, trips by default, indexed by ${table}_b).
sub check_given_up
{
	my ($node, $at, $what, $rows, $table) = @_;
	$table ||= 'trips';
	like(log_since($node, $at), $other_life, "$what: the log names the pool from another life");
	ok($node->poll_query_until('postgres', qq{SELECT status = 'ok' FROM amrtree_index_stats('${table}_b')}),
		"$what: the index is rebuilt");
	is($node->safe_psql('postgres', "SELECT count(*) FROM $table"), $rows,
		"$what: the table holds the restored rows");
	my ($m, $i) = amrwal_parity($node, $table);
	is($m, 0, "$what: every strategy through the index agrees with a sequential scan ($i)");
	is(amrwal_check($node, "${table}_b"), 't', "$what: amrtree_check");
}

my $tmp = PostgreSQL::Test::Utils::tempdir();
for my $kind ('disk', 'shm')
{
	my $pool = $kind eq 'disk' ? "$tmp/$kind-outside.pool" : amr_pool_path("lineage-$kind");
	my $node = lineage_primary("lin_$kind", $pool);
	my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM trips');

	# no false alarms: a clean restart, a crash
	my $at = -s $node->logfile;
	$node->restart;
	$node->stop('immediate');
	$node->start;
	my $log = log_since($node, $at);
	unlike($log, $other_life, "$kind: a clean restart and a crash keep the pool");
	unlike($log, qr/dropped the trees of/, "$kind: ... and no tree is dropped");

	# in-place PITR to a restore point taken before the later life
	$node->backup('hot');
	$node->safe_psql('postgres', q{SELECT pg_create_restore_point('before_later'); SELECT pg_switch_wal();});
	later_life($node, 1);
	isnt($node->safe_psql('postgres', 'SELECT count(*) FROM trips'), $rows, "$kind: the later life changed the table");
	$node->safe_psql('postgres', 'SELECT pg_switch_wal()');
	$node->poll_query_until('postgres',
		q{SELECT last_archived_wal >= pg_walfile_name(pg_current_wal_lsn() - 1) FROM pg_stat_archiver})
	  or die "archiving did not catch up";
	$node->stop;
	restore_in_place($node, $node->backup_dir . '/hot');
	$node->enable_restoring($node, 0);
	$node->append_conf('postgresql.conf',
		"recovery_target_name = 'before_later'\nrecovery_target_action = 'promote'\n");
	$at = -s $node->logfile;
	$node->start;
	$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
	check_given_up($node, $at, "$kind, PITR in place", $rows);

	# in-place restore of a copy of the stopped data directory
	$node->append_conf('postgresql.conf', "recovery_target_name = ''\n");
	$node->stop;
	my $cold = $node->backup_dir . '/cold';
	PostgreSQL::Test::RecursiveCopy::copypath($node->data_dir, $cold);
	$node->start;
	later_life($node, 2);
	$node->stop;
	restore_in_place($node, $cold);
	$at = -s $node->logfile;
	$node->start;
	check_given_up($node, $at, "$kind, cold copy in place", $rows);

	# the same when the later life changed only an unlogged table: its
	# changes have no records, and count at the WAL insert position
	$node->safe_psql('postgres', q{
CREATE UNLOGGED TABLE u AS SELECT id, b FROM trips;
CREATE INDEX u_b ON u USING amrtree (b);});
	my $urows = $node->safe_psql('postgres', 'SELECT count(*) FROM u');
	$node->stop;
	my $cold_u = $node->backup_dir . '/cold-unlogged';
	PostgreSQL::Test::RecursiveCopy::copypath($node->data_dir, $cold_u);
	$node->start;
	$node->safe_psql('postgres', 'DELETE FROM u WHERE id % 2 = 0; VACUUM u;');
	$node->stop;
	restore_in_place($node, $cold_u);
	$at = -s $node->logfile;
	$node->start;
	check_given_up($node, $at, "$kind, unlogged changes only", $urows, 'u');
	$node->stop;
}

# failover, pg_rewind, the old primary a standby on its leftover pool
my $old = lineage_primary('lin_old', "$tmp/old-outside.pool");
$old->backup('b');
my $new = amr_standby_own_pool($old, 'b', 'lin_new');
$new->start;
$old->wait_for_catchup($new);
$new->promote;
$new->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
later_life($old, 1);
$new->safe_psql('postgres', q{DELETE FROM trips WHERE id % 5 = 2; VACUUM trips;});
$new->poll_query_until('postgres', q{SELECT status = 'ok' FROM amrtree_index_stats('trips_b')})
  or die "the new primary did not rebuild its index";
$new->safe_psql('postgres', 'CHECKPOINT');
$old->stop;
my $conf = slurp_file($old->data_dir . '/postgresql.conf');
command_ok(
	[
		'pg_rewind', '--target-pgdata', $old->data_dir,
		'--source-server', $new->connstr('postgres'), '--no-sync'
	],
	'pg_rewind');
open(my $fh, '>', $old->data_dir . '/postgresql.conf') or die $!;
print $fh $conf;
close $fh;
$old->enable_streaming($new);
my $at = -s $old->logfile;
$old->start;
$new->safe_psql('postgres', q{INSERT INTO trips SELECT nextval('trip_ids'), b, t FROM trips WHERE id % 19 = 7;});
$new->wait_for_catchup($old);
like(log_since($old, $at), $other_life, 'rewound: the standby gives its leftover pool up');
like(amrwal_query($old, q{SELECT status FROM amrtree_index_stats('trips_b')}),
	qr/amrtree indexes cannot be used on this standby/, 'rewound: the standby does not use the index');
is($old->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM trips WHERE b && '(-8,42),(-9,41)'::box}),
	$new->safe_psql('postgres', q{SELECT count(*) FROM trips WHERE b && '(-8,42),(-9,41)'::box}),
	'rewound: its queries return the new primary\'s rows');
$old->promote;
$old->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
check_given_up($old, $at, 'rewound and promoted',
	$new->safe_psql('postgres', 'SELECT count(*) FROM trips'));

done_testing();

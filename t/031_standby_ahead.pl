# A restarted hot standby's pool is ahead of where its replay resumes: it
# holds every change replay made before the stop, among them VACUUM's
# removals of rows that still exist at the position replay resumes from.
# PostgreSQL lets queries in once replay reaches the consistent point
# (minRecoveryPoint), which knows nothing of the pool; amrtree must keep
# its indexes out until replay has passed the pool's WAL extent
# (amr_lineage.c), or an index scan misses those rows.
#
# The standby replays a DELETE of a third of the rows and their VACUUM,
# stops immediately, and starts again with replay paused at a target
# before the DELETE: queries there see every row, the index is left out
# (and amrtree_index_stats says until which position), and a query that
# would rather use it returns what a sequential scan returns.  Once replay
# is let go, the index is used again and agrees with a sequential scan.
#
# Then the same after an operating-system crash, which may keep pages the
# file's header does not cover (writeback:reboot_lost_extent stands in for
# it): the extent comes from the WAL in pg_wal.  And the same for a pool
# upgraded from format version 2, which records no extent
# (upgrade:extent_unknown stands in for the upgrade).  A promotion
# afterwards finds the extents reached, and a cascaded standby that a crash
# sends back to the old timeline keeps its pool.  Last, the same wait after
# a backend of a standby crashes and the postmaster restarts replay.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;
use AmrWal;

my $primary = amrwal_primary('sa_p', rows => 12000, seed => 31);
amrwal_setup($primary);
amrwal_windows($primary, 'trips', 60);
my $window = q{'(-8.55,41.20),(-8.70,41.09)'::box};

# On a standby whose pool is ahead of replay: the index waits for replay to
# pass $until, and a query that prefers it returns every row.
sub index_waits
{
	my ($node, $prefix, $until) = @_;
	like(amrwal_query($node, q{SELECT status FROM amrtree_index_stats('trips_b')}),
		qr/amrtree indexes cannot be used until WAL replay reaches/,
		"${prefix}the index waits for replay to pass $until");
	is($node->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM trips WHERE b && $window"),
		$node->safe_psql('postgres',
			"SET enable_indexscan = off; SET enable_indexonlyscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM trips WHERE b && $window"),
		"${prefix}a query that prefers the index returns every row");
}

$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('sa_s');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
# nothing but restartpoints moves the consistent point forward
$standby->append_conf('postgresql.conf', "bgwriter_lru_maxpages = 0\n");
$standby->start;
$primary->wait_for_catchup($standby);
$standby->safe_psql('postgres', 'CHECKPOINT');

my $rows = $primary->safe_psql('postgres', 'SELECT count(*) FROM trips');
my $before = $primary->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()');
$primary->safe_psql('postgres', 'DELETE FROM trips WHERE id % 3 = 0; VACUUM trips;');
$primary->wait_for_catchup($standby);
isnt($standby->safe_psql('postgres', 'SELECT count(*) FROM trips'), $rows, 'the standby replayed the DELETE');
$standby->stop('immediate');

$standby->append_conf('postgresql.conf',
	"recovery_target_lsn = '$before'\nrecovery_target_action = 'pause'\n");
$standby->start;
ok($standby->poll_query_until('postgres', q{SELECT pg_get_wal_replay_pause_state() = 'paused'}),
	'replay paused before the DELETE');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM trips'), $rows, 'there, the table has every row');
index_waits($standby, '', 'the pool');
unlike($standby->safe_psql('postgres', "SET enable_seqscan = off; EXPLAIN (COSTS OFF) SELECT count(*) FROM trips WHERE b && $window"),
	qr/trips_b/, '... because the plan leaves the index out');

# let replay go on, as a standby
$standby->append_conf('postgresql.conf', "recovery_target_lsn = ''\n");
$standby->restart;
$primary->safe_psql('postgres', 'INSERT INTO trips SELECT id + 5000000, b, t FROM trips WHERE id % 7 = 1');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('trips_b')}), 'ok',
	'past the pool, the index is used again');
my ($m, $i) = amrwal_parity($standby, 'trips');
is($m, 0, "every strategy through the standby's index agrees with a sequential scan ($i)");
is(amrwal_check($standby, 'trips_b'), 't', 'amrtree_check');
unlike(slurp_file($standby->logfile), qr/holds changes this data directory's WAL does not lead to/,
	'the standby kept its pool');

# A restart of the standby after which its pool is ahead of replay and
# records too low an extent, as $fault makes the start believe: the
# primary deletes ($delete) and vacuums after a restartpoint, the standby
# replays it, stops immediately and starts paused before the DELETE.  The
# log must say the extent was taken from the WAL in pg_wal ($said), the
# index must wait, and a query that prefers it must return every row; let
# go, replay passes the extent and the index serves again.
my $round = 0;
sub restart_with_unknown_extent
{
	my ($fault, $delete, $said, $what) = @_;
	$round++;
	# a restartpoint after every change so far, so that replay resumes past them
	$primary->safe_psql('postgres', 'CHECKPOINT');
	$primary->wait_for_catchup($standby);
	$standby->safe_psql('postgres', 'CHECKPOINT');
	# replay's next write syncs the file: complete past the restartpoint, so trusted
	sleep 2;
	my $rows = $primary->safe_psql('postgres', 'SELECT count(*) FROM trips');
	my $before = $primary->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()');
	$primary->safe_psql('postgres', "DELETE FROM trips WHERE $delete; VACUUM trips;");
	$primary->wait_for_catchup($standby);
	$standby->stop('immediate');
	$standby->append_conf('postgresql.conf',
		"amrtree.fault_injection = '$fault'\nrecovery_target_lsn = '$before'\n");
	my $log_from = -s $standby->logfile;
	$standby->start;
	ok($standby->poll_query_until('postgres', q{SELECT pg_get_wal_replay_pause_state() = 'paused'}),
		"$what: replay paused before the DELETE");
	like(substr(slurp_file($standby->logfile), $log_from), $said,
		"$what: the extent is taken from the WAL in pg_wal");
	is($standby->safe_psql('postgres', 'SELECT count(*) FROM trips'), $rows,
		"$what: there, a count returns every row");
	index_waits($standby, "$what: ", 'the end of that WAL');

	$standby->append_conf('postgresql.conf', "amrtree.fault_injection = ''\nrecovery_target_lsn = ''\n");
	$standby->restart;
	$primary->safe_psql('postgres',
		"INSERT INTO trips SELECT id + " . (5 + $round) * 1000000 . ", b, t FROM trips WHERE id % 7 = 2");
	$primary->wait_for_catchup($standby);
	is($standby->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('trips_b')}), 'ok',
		"$what: past the end of that WAL, the index is used again");
	my ($m, $i) = amrwal_parity($standby, 'trips');
	is($m, 0, "$what: every strategy agrees with a sequential scan ($i)");
}

# An operating-system crash of the standby.  Replay writes its pages and
# the header's extent into the page cache and syncs every second; the crash
# may keep a page and lose the extent that covers it, so the header can
# trail the pages.  The fault writeback:reboot_lost_extent stands in for
# such a crash at the next start: the file counts as written before a
# reboot, and its extent goes back to where recovery starts.
restart_with_unknown_extent('writeback:reboot_lost_extent', 'id % 3 = 1',
	qr/was written by WAL replay that had not synced it when the machine restarted; its WAL extent is raised/,
	'after a "reboot"');

# A standby restarted onto this version of amrtree: its pool, upgraded
# from format version 2 at the start, records no extent, yet is as far
# ahead of replay as after any restart.  upgrade:extent_unknown makes the
# start zero the extent as that upgrade leaves it.
restart_with_unknown_extent('upgrade:extent_unknown', 'id % 5 = 0',
	qr/does not record where in the WAL its contents come from; taking/,
	'after an "upgrade"');

# a cascaded standby of the standby, for the promotion below
$standby->backup('sb');
my $cascade = PostgreSQL::Test::Cluster->new('sa_c');
$cascade->init_from_backup($standby, 'sb', has_streaming => 1);
$cascade->start;
# amrtree records on the old timeline after the cascaded standby's last
# restartpoint, which its replay will go through again
$primary->safe_psql('postgres', 'INSERT INTO trips SELECT id + 8000000, b, t FROM trips WHERE id % 13 = 5');
$primary->wait_for_catchup($standby);
$standby->wait_for_catchup($cascade, 'replay', $standby->lsn('replay'));

# the raised extents are WAL this data directory has: promotion keeps the pool
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the standby did not finish its promotion';
$standby->safe_psql('postgres', 'INSERT INTO trips SELECT id + 9000000, b, t FROM trips WHERE id % 11 = 3');

# The cascaded standby follows its upstream onto the new timeline and
# replays the insert there; stopped by a crash, it resumes at its last
# restartpoint, from before the promotion, on the old timeline -- which
# leads to its pool's extent on the new one.  It took that for a timeline
# that branched off before the extent and gave its pool up (the indexes
# unusable there until a promotion rebuilt them).
$standby->wait_for_catchup($cascade, 'replay', $standby->lsn('insert'));
is($cascade->safe_psql('postgres', 'SELECT timeline_id FROM pg_control_checkpoint()'), '1',
	'the cascaded standby restarts from before the timeline switch');
$cascade->stop('immediate');
$cascade->start;
$standby->wait_for_catchup($cascade, 'replay', $standby->lsn('insert'));
is($cascade->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('trips_b')}), 'ok',
	'the cascaded standby uses the index once replay passes its pool');
($m, $i) = amrwal_parity($cascade, 'trips');
is($m, 0, "on the cascaded standby, every strategy agrees with a sequential scan ($i)");
unlike(slurp_file($cascade->logfile), qr/holds changes this data directory's WAL does not lead to/,
	'the cascaded standby kept its pool');
$cascade->stop;
($m, $i) = amrwal_parity($standby, 'trips');
is($m, 0, "after promotion, every strategy agrees with a sequential scan ($i)");
is(amrwal_check($standby, 'trips_b'), 't', 'amrtree_check after promotion');
unlike(slurp_file($standby->logfile), qr/holds changes this data directory's WAL does not lead to/,
	'promotion kept the pool');

# A backend crash on a hot standby: the postmaster restarts replay from the
# last restartpoint, over the same pool, which holds VACUUM's removals from
# after it.  The crash restart lowered the pool's extent as on a primary,
# so the check was never set and queries used the index at once: with
# replay held at the DELETE's commit (recovery_min_apply_delay), an index
# scan missed the deleted rows the sequential scan still saw (a plain
# count(*), through an index-only scan of the amrtree index, too).
$primary->backup('bk');
my $crashy = PostgreSQL::Test::Cluster->new('sa_k');
$crashy->init_from_backup($primary, 'bk', has_streaming => 1);
$crashy->append_conf('postgresql.conf', "restart_after_crash = on\nbgwriter_lru_maxpages = 0\n");
$crashy->start;
$primary->safe_psql('postgres', 'CHECKPOINT');
$primary->wait_for_catchup($crashy);
$crashy->safe_psql('postgres', 'CHECKPOINT');
$rows = $primary->safe_psql('postgres', 'SELECT count(*) FROM trips');
$primary->safe_psql('postgres', 'DELETE FROM trips WHERE id % 4 = 1; VACUUM trips;');
$primary->wait_for_catchup($crashy);
isnt($crashy->safe_psql('postgres', 'SELECT count(*) FROM trips'), $rows, 'backend crash: the standby replayed the DELETE');
# replay after the restart waits at the DELETE's commit
$crashy->append_conf('postgresql.conf', "recovery_min_apply_delay = '1h'\n");
$crashy->reload;
sleep 1;    # the write-back reaches the file
my $log_at = -s $crashy->logfile;
my $victim = $crashy->background_psql('postgres');
my $pid = $victim->query_safe('SELECT pg_backend_pid()');
kill 9, $pid;
amr_wait_for_crash_restart($crashy, $log_at) or die 'the standby did not come back';
eval { $victim->quit };
is($crashy->safe_psql('postgres',
		'SET enable_indexscan = off; SET enable_indexonlyscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM trips'),
	$rows, 'backend crash: replay waits before the DELETE');
# the planner may count through any index; the amrtree one counted 3697 of
# 4927 rows here before the fix
is($crashy->safe_psql('postgres', 'SELECT count(*) FROM trips'), $rows, 'backend crash: a count returns every row');
index_waits($crashy, 'backend crash: ', 'the pool');
$crashy->append_conf('postgresql.conf', "recovery_min_apply_delay = 0\n");
$crashy->reload;
$primary->wait_for_catchup($crashy);
is($crashy->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('trips_b')}), 'ok',
	'backend crash: past the pool, the index is used again');
($m, $i) = amrwal_parity($crashy, 'trips');
is($m, 0, "backend crash: every strategy agrees with a sequential scan ($i)");
$crashy->stop;

done_testing();

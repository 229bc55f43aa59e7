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
like(amrwal_query($standby, q{SELECT status FROM amrtree_index_stats('trips_b')}),
	qr/amrtree indexes cannot be used until WAL replay reaches/,
	'the index waits for replay to pass the pool');
my $window = q{'(-8.55,41.20),(-8.70,41.09)'::box};
is($standby->safe_psql('postgres',
		"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM trips WHERE b && $window"),
	$standby->safe_psql('postgres',
		"SET enable_indexscan = off; SET enable_indexonlyscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM trips WHERE b && $window"),
	'a query that prefers the index returns every row');
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

done_testing();

# The tier manager killed with SIGKILL in the middle of migrations: the
# postmaster restarts every process, the inner nodes are rebuilt from the
# Leaf Table, and no leaf is lost or duplicated (each crash checked with
# amrtree_check, parity with a sequential scan, and exact counts).  Queries
# stay correct while the worker is dead.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# io_method = sync and ssd_sync = dsync: the tier manager then writes a
# wave of demotions one durable slot at a time (about half a second for
# this index) instead of 256 per io_uring submission and one sync (a few
# tens of ms), so that the kills below land inside waves; it also puts the
# plain pread/pwrite path and O_DSYNC through crashes.
my $node = amr_node('crash',
	conf => "restart_after_crash = on\namrtree.scan_interval = 50ms\n"
	  . "amrtree.io_method = sync\namrtree.ssd_sync = dsync\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');
amr_load_porto($node, 'trips', 120000, 5);
$node->safe_psql('postgres', q{
CREATE INDEX trips_b ON trips USING amrtree (b);
VACUUM ANALYZE trips;
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows
SELECT g, box(point(-8.66 + (g % 6) * 0.015, 41.13 + (g / 6) * 0.008),
              point(-8.66 + (g % 6) * 0.015 + 0.004, 41.13 + (g / 6) * 0.008 + 0.003))
FROM generate_series(0, 23) g;
});
amr_setup_parity($node);
my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM trips');
my $leaves = $node->safe_psql('postgres', q{SELECT leaves FROM amrtree_index_stats('trips_b')});

sub worker_pid
{
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'amrtree tier manager'");
}

my $partial = 0;
my @delays_ms = (15, 40, 70, 25, 55, 100);
my $rounds = scalar @delays_ms;
my $target = 0;
for my $round (1 .. $rounds)
{
	# flip the budget so that the worker has most leaves to move
	my $budget = $round % 2 ? '5%' : '95%';
	$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'amrtree tier manager'")
	  or die 'the tier manager did not come back';
	my $pid = worker_pid();
	$node->safe_psql('postgres', "ALTER INDEX trips_b SET (pmem_budget = '$budget')");
	# the next use of the index hands the new budget to the worker
	$node->safe_psql('postgres', "SELECT count(*) FROM trips WHERE b && '((0,0),(0,0))'");
	my $on_pmem_before = $node->safe_psql('postgres',
		"SELECT leaves FROM amrtree_tier_stats('trips_b') WHERE tier = 'pmem'");
	$target = $budget eq '5%' ? int(0.05 * $leaves) : int(0.95 * $leaves);
	if ($budget eq '5%')
	{
		# demotions commit in batches: kill as soon as the first one shows
		for (1 .. 500)
		{
			last if $node->safe_psql('postgres',
				"SELECT leaves FROM amrtree_tier_stats('trips_b') WHERE tier = 'pmem'") != $on_pmem_before;
			usleep(1000);
		}
	}
	else
	{
		usleep(1000 * $delays_ms[$round - 1]);
	}
	my $log_at = -s $node->logfile;
	kill 'KILL', $pid;
	amr_wait_for_crash_restart($node, $log_at) or die 'server did not come back';

	my ($pmem, $ssd) = split /\|/, $node->safe_psql('postgres', q{
SELECT sum(leaves) FILTER (WHERE tier = 'pmem'), sum(leaves) FILTER (WHERE tier = 'ssd')
FROM amrtree_tier_stats('trips_b')});
	note "round $round (budget $budget): killed the tier manager with $pmem leaves on PMEM "
	  . "(from $on_pmem_before, heading for $target), $ssd on SSD";
	# caught in the middle: some leaves moved, not all
	$partial++ if $pmem != $on_pmem_before && abs($pmem - $target) > 1;
	is($node->safe_psql('postgres', q{SELECT amrtree_check('trips_b')}), 't', "round $round: amrtree_check after the crash");
	is($pmem + $ssd, $leaves, "round $round: no leaf lost or duplicated ($leaves leaves)");
	is($node->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('trips_b')}), $rows,
		"round $round: every entry is still there");
	my ($m) = amr_parity_mismatches($node, 'trips');
	is($m, 0, "round $round: index agrees with a sequential scan");
}
cmp_ok($partial, '>', 0, "at least one crash interrupted a wave of migrations ($partial of $rounds)");

# queries stay correct while the worker is dead (it restarts after 5 s)
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'amrtree tier manager'");
$node->safe_psql('postgres', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'amrtree tier manager'");
my ($m) = amr_parity_mismatches($node, 'trips');
is($m, 0, 'index agrees with a sequential scan while the tier manager is down');
$node->safe_psql('postgres', q{INSERT INTO trips SELECT id + 1000000, b, t FROM trips WHERE id % 10 = 0});
is($node->safe_psql('postgres', q{SELECT amrtree_check('trips_b')}), 't', 'inserts without the tier manager keep the tree valid');
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'amrtree tier manager'"),
	'the tier manager is restarted');

$node->stop;
done_testing();

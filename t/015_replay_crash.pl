# Crashes while amrtree WAL is replayed: a streaming hot standby (pool and
# slot file inside its data directory, copied by the base backup) replays a
# primary that inserts, deletes, vacuums and migrates leaves between tiers
# under pgbench.
#
#  - five times the standby goes down in the middle of replay (immediate
#    stop; SIGKILL of the postmaster; SIGKILL of the startup process, which
#    takes the server down; an abort inside amrtree's replay of an append
#    and of a split), is started again, and catches up;
#  - twice the primary stops with -m immediate under load and restarts
#    (crash recovery), and the standby reconnects by itself and catches up.
#
# After each, with the load stopped: the standby holds the primary's heap,
# its index returns what the primary's returns, index and bitmap scans agree
# with sequential scans on both servers, amrtree_check holds on both and
# the trees have the same leaves and entries.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;
use AmrWal;

my $started = time;

my $primary = amrwal_primary('primary', rows => 20000, seed => 15);
amrwal_setup($primary);
amrwal_windows($primary, 'trips', 120);
$primary->safe_psql('postgres', q{SELECT amrtree_settle('trips_b', 0)});

$primary->backup('b1');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b1', has_streaming => 1);
$standby->start;

my $scripts = amrwal_scripts(ins => 40, hot => 20, del => 12, vac => 1);

# Load stopped: compare the standby with the primary.
sub compare
{
	my ($what) = @_;
	ok(amrwal_catchup($primary, $standby), "$what: the standby caught up") or die 'the standby did not catch up';
	amrwal_same_digest(amrwal_heap_digest($standby, 'trips'), amrwal_heap_digest($primary, 'trips'),
		"$what: the standby's heap is the primary's");
	my ($m, $i, $seq, $pidx) = amrwal_parity($primary, 'trips');
	is($m, 0, "$what: primary: index and bitmap scans agree with a sequential scan ($i)");
	($m, $i, $seq, my $sidx) = amrwal_parity($standby, 'trips');
	is($m, 0, "$what: standby: index and bitmap scans agree with a sequential scan ($i)");
	amrwal_same_digest($sidx, $pidx, "$what: the standby's index returns what the primary's returns");
	is(amrwal_check($primary, 'trips_b'), 't', "$what: primary: amrtree_check");
	is(amrwal_check($standby, 'trips_b'), 't', "$what: standby: amrtree_check");
	is(amrwal_shape($standby, 'trips_b'), amrwal_shape($primary, 'trips_b'),
		"$what: the standby's tree has the primary's leaves and entries");
}

compare('after the base backup');

# move leaves between the tiers on the primary while the load runs
my @budgets = ('20%', '70%');
sub migrate
{
	my ($round) = @_;
	my $budget = $budgets[ $round % 2 ];
	my $moved = amrwal_query($primary,
		"ALTER INDEX trips_b SET (pmem_budget = '$budget'); SELECT amrtree_settle('trips_b', 0)");
	note "round $round: pmem_budget $budget, amrtree_settle moved $moved";
	return $moved;
}

# A checkpoint on the primary, replayed, then a restartpoint on the standby:
# its next start begins redo there (after leaves have changed since) instead
# of at the base backup's checkpoint.  Returns the restartpoint's redo LSN.
sub restartpoint
{
	$primary->safe_psql('postgres', 'CHECKPOINT');
	amrwal_catchup($primary, $standby) or die 'the standby did not catch up';
	$standby->safe_psql('postgres', 'CHECKPOINT');
	return $standby->safe_psql('postgres', 'SELECT redo_lsn FROM pg_control_checkpoint()');
}

# [ what, restartpoint first?, how ]
my @standby_crashes = (
	[ 'immediate stop', 0, sub { $standby->stop('immediate'); } ],
	[
		'SIGKILL of the postmaster, after a restartpoint', 1,
		sub {
			my $pm = amrwal_pm_pid($standby) or die 'standby not running';
			my @children = amrwal_child_pids($pm);
			$standby->kill9;
			# its children exit when they notice; the next start needs them gone
			amrwal_wait_pids_gone($pm, @children) or die 'the standby\'s processes did not exit';
		}
	],
	[
		'SIGKILL of the startup process, after a restartpoint', 1,
		sub {
			my $pm = amrwal_pm_pid($standby) or die 'standby not running';
			my $startup = amrwal_startup_pid($standby) or die 'no startup process';
			my @children = amrwal_child_pids($pm);
			kill 9, $startup;
			# a failed startup process takes the server down (it is not
			# restarted like a crashed backend)
			amrwal_wait_pids_gone($pm, @children) or die 'the standby did not go down';
			$standby->stop('immediate', fail_ok => 1);    # forget the dead postmaster
		}
	],
	[ 'abort inside the replay of an append', 0, sub { abort_in_replay('redo:before_append:25') } ],
	[ 'abort inside the replay of a split', 0, sub { abort_in_replay('redo:before_split:2') } ],
);

# Arm a fault point of amrtree's replay on the standby: its startup process
# aborts there, which takes the server down; the point then stays disarmed
# (amrtree_fault_fired), and the standby restarts and replays on.
sub abort_in_replay
{
	my ($point) = @_;
	my $pm = amrwal_pm_pid($standby) or die 'standby not running';
	my @children = amrwal_child_pids($pm);
	unlink($standby->data_dir . '/amrtree_fault_fired');    # arm it again
	$standby->append_conf('postgresql.conf', "amrtree.fault_injection = '$point'\n");
	$standby->reload;
	amrwal_wait_pids_gone($pm, @children) or die "the standby did not go down at $point";
	$standby->stop('immediate', fail_ok => 1);    # forget the dead postmaster
	$standby->append_conf('postgresql.conf', "amrtree.fault_injection = ''\n");
	(my $name = $point) =~ s/:\d+$//;
	ok(slurp_file($standby->logfile) =~ /fault injection: aborting at "\Q$name\E"/,
		"the standby's replay aborted at $name");
}

my $round = 0;
for my $crash (@standby_crashes)
{
	my ($how, $checkpoint, $do) = @$crash;
	$round++;
	my $what = "standby round $round ($how)";
	my $load = amrwal_start_load($primary, scripts => $scripts, seconds => 1);
	sleep 1;
	my $redo = $checkpoint ? restartpoint() : undef;
	like(migrate($round), qr/^\d+$/, "$what: leaves migrated on the primary under load");
	usleep(300_000);
	my $replayed = $standby->safe_psql('postgres', 'SELECT pg_last_wal_replay_lsn()');
	my $log_at = -s $standby->logfile;
	$do->();
	sleep 1;                                    # the primary carries on meanwhile
	$standby->start;
	ok(amr_wait_for_server($standby), "$what: the standby accepts connections again");
	if ($checkpoint)
	{
		like(slurp_file($standby->logfile, $log_at), qr/redo starts at \Q$redo\E\b/,
			"$what: redo started at the restartpoint ($redo)");
	}
	sleep 1;
	my $r = amrwal_stop_load($load);
	amrwal_load_ok($r, "$what: load on the primary");
	compare($what);
	ok(!$standby->log_contains(qr/PANIC|TRAP|server process .* was terminated by signal (?!9)/, $log_at),
		"$what: no PANIC or unexpected crash during replay");
	cmp_ok($standby->safe_psql('postgres', "SELECT pg_last_wal_replay_lsn() - '$replayed'"), '>', 0,
		"$what: the standby replayed WAL past the crash");
}

for my $i (1 .. 2)
{
	$round++;
	my $what = "primary round $i (immediate stop under load)";
	my $load = amrwal_start_load($primary, scripts => $scripts, seconds => 1);
	sleep 1;
	# the second time, a checkpoint first: crash recovery then replays the
	# leaf changes after it
	$primary->safe_psql('postgres', 'CHECKPOINT') if $i == 2;
	migrate($round);
	usleep(300_000);
	$primary->stop('immediate');
	$primary->start;
	sleep 2;                                    # the load reconnects
	my $r = amrwal_stop_load($load);
	cmp_ok($r->{tx}, '>', 0, "$what: the load ran ($r->{tx} transactions, $r->{failed_runs} of $r->{runs} runs cut short)");
	ok(!grep({ /ERROR/ && !/terminating connection|shutdown|shutting down|starting up|recovery/ } @{ $r->{errors} }),
		"$what: no client saw an ERROR other than the stop")
	  or diag(join("\n", grep { /ERROR/ } @{ $r->{errors} }));
	compare($what);
}

$standby->stop;
$primary->stop;
note sprintf('%.0f s', time - $started);
done_testing();

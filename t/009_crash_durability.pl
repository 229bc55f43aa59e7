# No lost rows, no phantom rows across crashes (DESIGN 5).
#
#  1. A backend crashes in the middle of a transaction after hundreds of its
#     index entries were persisted but before its heap inserts reached
#     durable WAL: recovery drops those entries (their WAL position lies
#     beyond the end of the replayed WAL), so that after VACUUM an
#     index-only scan counts exactly the heap's rows -- without the pruning
#     it would count the vanished rows as phantoms.
#  2. pg_ctl stop -m immediate during a 2-client insert workload, with
#     synchronous_commit on and off: every acknowledged commit (on) is found
#     through the index, and the index returns exactly the heap's rows.
#  3. A crash during recovery itself (the server is stopped again while it
#     replays), then a crash inside the reconciliation, still ends well.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# walwriter must not flush the dying transaction's WAL behind our back
my $node = amr_node('durable', conf => q{
restart_after_crash = on
wal_writer_delay = 10s
wal_writer_flush_after = 0
amrtree.ssd_size = 64MB
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE pts (id int, b box);
INSERT INTO pts SELECT g, box(point(g % 100, g / 100), point(g % 100 + 0.5, g / 100 + 0.5))
  FROM generate_series(1, 5000) g;
CREATE INDEX pts_b ON pts USING amrtree (b);
CHECKPOINT;
});

# Checks after every crash: amrtree_check, the same rows as a sequential
# scan for a few windows, and after VACUUM an index-only scan counting the
# heap's rows exactly.
sub check_table
{
	my ($table, $what) = @_;
	is($node->safe_psql('postgres', "SELECT amrtree_check('${table}_b')"), 't', "$what: amrtree_check");
	my $diff = $node->safe_psql('postgres', qq{
SET enable_seqscan = off;
SELECT count(*) FROM (
  (SELECT id FROM $table WHERE b && box '((10,10),(40,30))' EXCEPT ALL
   SELECT id FROM (SELECT id, b FROM $table OFFSET 0) s WHERE b && box '((10,10),(40,30))')
  UNION ALL
  (SELECT id FROM (SELECT id, b FROM $table OFFSET 0) s WHERE b && box '((10,10),(40,30))' EXCEPT ALL
   SELECT id FROM $table WHERE b && box '((10,10),(40,30))')) d});
	is($diff, 0, "$what: index rows equal sequential-scan rows");
	$node->safe_psql('postgres', "VACUUM $table");
	my $plan = $node->safe_psql('postgres', qq{
SET enable_seqscan = off; SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM $table WHERE b && box '((-1e9,-1e9),(1e9,1e9))'});
	like($plan, qr/Index Only Scan using ${table}_b/, "$what: the count below is an index-only scan");
	my $ios = $node->safe_psql('postgres', qq{
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM $table WHERE b && box '((-1e9,-1e9),(1e9,1e9))'});
	my $heap = $node->safe_psql('postgres', "SELECT count(*) FROM $table WHERE b IS NOT NULL");
	is($ios, $heap, "$what: index-only scan counts the heap's $heap rows (no phantom)");
}

# after a crash at a moment when the log had $log_at bytes
sub wait_for_restart
{
	my ($log_at) = @_;
	amr_wait_for_crash_restart($node, $log_at)
	  or die 'the server did not come back after the crash';
}

# --- 1. the dying transaction's entries are pruned
my $log_at = -s $node->logfile;
my ($ret, $out, $err) = $node->psql('postgres', q{
SET amrtree.fault_injection = 'append:after_entry_persisted:700';
INSERT INTO pts SELECT 100000 + g, box(point(g % 100, g / 100), point(g % 100 + 0.5, g / 100 + 0.5))
  FROM generate_series(1, 1000) g;});
isnt($ret, 0, 'the backend crashed at the 700th append');
wait_for_restart($log_at);
unlink($node->data_dir . '/amrtree_fault_fired');
# A background process reconciles after the restart, and may log what it
# pruned a moment after the server accepts connections; the first use of
# the index waits for it.
$node->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM pts WHERE b && box '((1,1),(2,2))'});
my $log = slurp_file($node->logfile, $log_at);
like($log, qr/fault injection: aborting at "append:after_entry_persisted"/, 'at the injected point');
my ($dropped) = $log =~ /dropped (\d+) entries inserted beyond it/;
ok(defined $dropped && $dropped >= 600,
	'recovery dropped the entries whose heap inserts were lost (' . ($dropped // 'none') . ')');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pts'), 5000, 'the heap lost the uncommitted rows');
check_table('pts', 'after the mid-transaction crash');

# --- 1b. a clean stop after recovery, before anyone reconciled
# Recovery ends, then the server is shut down cleanly before any process
# reconciled (here the reconciliation is made to fail): the next start
# looks clean to PostgreSQL, yet must still prune to the end of the WAL
# that the recovery replayed, which the startup process recorded.
$node->append_conf('postgresql.conf', "amrtree.fault_injection = 'reconcile:fail'\n");
$node->reload;
$log_at = -s $node->logfile;
($ret, $out, $err) = $node->psql('postgres', q{
SET amrtree.fault_injection = 'append:after_entry_persisted:700';
INSERT INTO pts SELECT 300000 + g, box(point(g % 100, g / 100), point(g % 100 + 0.5, g / 100 + 0.5))
  FROM generate_series(1, 1000) g;});
isnt($ret, 0, 'a second backend crashed at its 700th append');
wait_for_restart($log_at);
($ret, $out, $err) = $node->psql('postgres',
	q{SET enable_seqscan = off; SELECT count(*) FROM pts WHERE b && box '((1,1),(2,2))'});
like($err, qr/reconciliation refused/, 'after recovery nobody could reconcile');
$node->stop('fast');
like(`pg_controldata ${\ $node->data_dir}`, qr/cluster state:\s+shut down\n/,
	'the server then shut down cleanly');
$node->append_conf('postgresql.conf', "amrtree.fault_injection = ''\n");
unlink($node->data_dir . '/amrtree_fault_fired');
$log_at = -s $node->logfile;
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM pts'), 5000, 'the heap lost the uncommitted rows again');
# the first use waits for the reconciliation, which logs what it pruned
$node->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM pts WHERE b && box '((1,1),(2,2))'});
$log = slurp_file($node->logfile, $log_at);
($dropped) = $log =~ /dropped (\d+) entries inserted beyond it/;
ok(defined $dropped && $dropped >= 600,
	'the clean start still pruned to the end of the earlier recovery (' . ($dropped // 'none') . ')');
check_table('pts', 'after a clean stop between recovery and reconciliation');

# --- 2. immediate stop under a 2-client insert workload
my $dir = PostgreSQL::Test::Utils::tempdir();
for my $sync ('on', 'off')
{
	$node->safe_psql('postgres', qq{
ALTER SYSTEM SET synchronous_commit = '$sync';
SELECT pg_reload_conf();
DROP TABLE IF EXISTS w;
CREATE TABLE w (id bigint, b box);
CREATE INDEX w_b ON w USING amrtree (b);});
	my $script = "$dir/insert-$sync.sql";
	open my $fh, '>', $script or die;
	print $fh <<'SQL';
\set x random(0, 100000)
\set y random(0, 100000)
INSERT INTO w VALUES (:client_id::bigint * 10000000000 + :x::bigint * 100000 + :y,
  box(point(:x / 1000.0, :y / 1000.0), point(:x / 1000.0 + 0.01, :y / 1000.0 + 0.01)))
  RETURNING id \gset
\shell echo :id >> @DIR@/acked-@SYNC@
SQL
	close $fh;
	system("sed -i 's|\@DIR\@|$dir|; s|\@SYNC\@|$sync|' $script");
	unlink "$dir/acked-$sync";
	my $h = IPC::Run::start([ 'pgbench', '-n', '-c', '2', '-j', '2', '-T', '30',
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres' ],
		'>', "$dir/pgbench-$sync.out", '2>&1');
	sleep 3;
	$node->stop('immediate');
	$h->finish;
	$node->start;
	my @acked = do { open my $a, '<', "$dir/acked-$sync" or die; map { chomp; $_ } <$a> };
	cmp_ok(scalar @acked, '>', 50, "synchronous_commit = $sync: the workload committed rows before the stop (" . scalar(@acked) . ')');
	my $missing = $node->safe_psql('postgres', q{
CREATE TEMP TABLE acked (id bigint);
COPY acked FROM '} . "$dir/acked-$sync" . q{';
SET enable_seqscan = off;
SELECT count(*) FROM acked a
WHERE NOT EXISTS (SELECT 1 FROM w WHERE w.b && box '((-1,-1),(1000,1000))' AND w.id = a.id)});
	if ($sync eq 'on')
	{
		is($missing, 0, 'synchronous_commit = on: every acknowledged row is found through the index');
	}
	else
	{
		note "synchronous_commit = off: $missing acknowledged rows were lost with the WAL they were in (allowed)";
	}
	check_table('w', "immediate stop, synchronous_commit = $sync");
}
$node->safe_psql('postgres', 'ALTER SYSTEM RESET synchronous_commit; SELECT pg_reload_conf()');

# --- kill -9 of a backend in the middle of the workload
{
	$node->safe_psql('postgres', 'TRUNCATE w');
	my $script = "$dir/insert-kill.sql";
	open my $fh, '>', $script or die;
	print $fh <<'SQL';
\set x random(0, 100000)
\set y random(0, 100000)
INSERT INTO w VALUES (:x, box(point(:x / 1000.0, :y / 1000.0), point(:x / 1000.0 + 0.01, :y / 1000.0 + 0.01)));
SQL
	close $fh;
	my $h = IPC::Run::start([ 'pgbench', '-n', '-c', '2', '-j', '2', '-T', '30',
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres' ],
		'>', "$dir/pgbench-kill.out", '2>&1');
	sleep 2;
	# the test framework sets PGAPPNAME, so find pgbench's backends by query
	my $victim = '';
	for (1 .. 50)
	{
		$victim = $node->safe_psql('postgres',
			q{SELECT pid FROM pg_stat_activity WHERE query LIKE 'INSERT INTO w %' AND pid <> pg_backend_pid() LIMIT 1});
		last if $victim;
		usleep(100_000);
	}
	my $kill_at = -s $node->logfile;
	ok(kill('KILL', $victim), "kill -9 of an inserting backend ($victim)");
	$h->finish;
	wait_for_restart($kill_at);
	check_table('w', 'after kill -9 of a backend');
}

# --- 3. a crash while recovering, and a crash inside the reconciliation
# The filler is WAL-logged (a CREATE TABLE AS would skip the WAL under
# wal_level = minimal), so that replaying it takes long enough to be
# interrupted.
$node->safe_psql('postgres', q{
CHECKPOINT;
INSERT INTO pts SELECT 200000 + g, box(point(g, g), point(g + 1, g + 1)) FROM generate_series(1, 3000) g;
CREATE TABLE filler (g int, pad text);
INSERT INTO filler SELECT g, repeat('x', 200) FROM generate_series(1, 400000) g;});
$node->stop('immediate');
# start without waiting and stop again once the startup process replays
my $pgdata = $node->data_dir;
$log_at = -s $node->logfile;
system_or_bail('pg_ctl', '-D', $pgdata, '-l', $node->logfile, '-W', 'start');
for (1 .. 2000)
{
	last if slurp_file($node->logfile, $log_at) =~ /redo starts at/;
	usleep(5_000);
}
system('pg_ctl', '-D', $pgdata, '-m', 'immediate', 'stop');
# what the control file says decides what the next start must report
my $in_recovery = `pg_controldata $pgdata` =~ /cluster state:\s+in crash recovery/;
note $in_recovery ? 'stopped the server during crash recovery'
  : 'recovery finished before it could be interrupted';
$node->append_conf('postgresql.conf', "amrtree.fault_injection = 'reconcile:after_prune'\n");
$log_at = -s $node->logfile;
$node->start;
# the first use reconciles, crashes at the point, and the restart reconciles again
$node->poll_query_until('postgres', q{SELECT count(*) > 0 FROM pts WHERE b && box '((1,1),(2,2))'})
  or die 'no answer after the crash in the reconciliation';
$log = slurp_file($node->logfile, $log_at);
like($log, qr/fault injection: aborting at "reconcile:after_prune"/, 'the reconciliation itself crashed once');
like(slurp_file($node->logfile), qr/was interrupted while in recovery/, 'a crash during recovery preceded this start')
  if $in_recovery;
$node->append_conf('postgresql.conf', "amrtree.fault_injection = ''\n");
$node->reload;
unlink($node->data_dir . '/amrtree_fault_fired');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pts'), 8000, 'the committed rows survived');
check_table('pts', 'after crashes during recovery and reconciliation');

$node->stop;
done_testing();

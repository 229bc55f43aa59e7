# A split whose WAL record is lost in a crash, and a standby that must
# still end up with the primary's leaves: crash recovery prunes the entries
# beyond the replayed WAL and logs both halves of the split again, whole,
# found by their WAL stamps.  Two ways that went wrong:
#
# 1. One SSD leaf is full; a transaction splits it and writes into both halves,
# and its backend crashes before any of that WAL reached the disk.  Recovery
# ends before the split, so the primary's pruning removes the new entries
# from both halves -- but the split itself stays, and the standby never saw
# it: the pruning logs both halves again, whole.  Here the pruning crashes
# right after it rewrote the first half (reconcile:after_prune_rewrite), and
# the second pass, to the same horizon, must still get both halves to the
# standby: the first half's rewrite, switched before the tree's resync
# record, keeps its WAL stamp beyond the horizon.  (When a switch gave the
# half a stamp within the horizon, the second pass skipped it, and the
# standby held the old full leaf beside the new second half: every entry of
# that half twice.)
#
# 2. A PMEM leaf splits and the tier manager moves both halves to SSD,
# logging nothing; the move must not lower the first half's stamp below
# the split's record (see part 2 below).
#
# The pool is on /dev/shm (every store at once durable, as on PMEM); the
# standby has a pool of its own, and the indexes are created after it
# started.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# no WAL may reach the disk behind the dying transaction's back
my $primary = amr_node('primary', init => { allows_streaming => 1 }, conf => q{
restart_after_crash = on
wal_writer_delay = 10s
wal_writer_flush_after = 0
wal_buffers = 4MB
autovacuum = off
amrtree.ssd_size = 16MB
amrtree.budget_on_insert = strict
});
$primary->start;
$primary->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE s (id int, b box);
CREATE TABLE filler (x int, pad text);});
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'standby');
$standby->start;

# The standby's live entries of an index, leaf by leaf, are the primary's.
sub standby_holds_primary_entries
{
	my ($index, $name) = @_;
	my $leaves = qq{SELECT string_agg(leaf_id || ':' || tid, ' ' ORDER BY leaf_id, tid)
FROM amrtree_leaf_entries('$index') WHERE NOT dead};
	return is($standby->safe_psql('postgres', $leaves), $primary->safe_psql('postgres', $leaves), $name);
}

# Once the standby has caught up, what an amrtree index scan there (no
# sequential or bitmap scan) returns for $query.
sub standby_index_scan_is
{
	my ($query, $expected, $name) = @_;
	$primary->wait_for_catchup($standby);
	return is($standby->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; $query"),
		$expected, $name);
}

# one leaf on the SSD tier (a budget below one leaf, held to by inserts
# too), filled to capacity
$primary->safe_psql('postgres', q{
CREATE INDEX s_b ON s USING amrtree (b) WITH (pmem_budget = '1kB');});
my $capacity = 84;
$primary->safe_psql('postgres', "INSERT INTO s VALUES ($_, box(point($_, $_), point($_ + 0.5, $_ + 0.5)))")
  for 1 .. $capacity;
is($primary->safe_psql('postgres', q{SELECT leaves || ' ' || entries || ' ' || pmem_bytes FROM amrtree_index_stats('s_b')}),
	"1 $capacity 0", "one SSD leaf holds $capacity entries");
# more than 64 kB of WAL after the leaf's last entry, then a checkpoint, so
# that the stamp of the entries that will survive lies well within the
# horizon
$primary->safe_psql('postgres', q{
INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
CHECKPOINT;});
$primary->wait_for_catchup($standby);

# the pruning may not run before the test arms its crash point
$primary->safe_psql('postgres', q{
ALTER SYSTEM SET amrtree.fault_injection = 'reconcile:fail'; SELECT pg_reload_conf();});

# the dying transaction: a split, then writes into both halves, each an
# SSD rewrite; its backend crashes at the tenth of them
my $log_at = -s $primary->logfile;
my ($ret) = $primary->psql('postgres', q{
BEGIN;
SET amrtree.fault_injection = 'rewrite:after_switch:10';
INSERT INTO s SELECT 1000 + g, box(point(g * 7 % 84, g * 7 % 84), point(g * 7 % 84 + 0.25, g * 7 % 84 + 0.25))
  FROM generate_series(1, 40) g;
COMMIT;});
isnt($ret, 0, 'the backend crashed in the middle of the transaction')
  or die 'the transaction did not reach its crash point';
amr_wait_for_crash_restart($primary, $log_at) or die 'the primary did not come back';
like(slurp_file($primary->logfile, $log_at), qr/aborting at "rewrite:after_switch"/,
	'at the tenth SSD rewrite after the split');
unlink $primary->data_dir . '/amrtree_fault_fired';

# the pruning crashes right after its first SSD rewrite
$log_at = -s $primary->logfile;
my $prune_at = $log_at;
$primary->safe_psql('postgres', q{
ALTER SYSTEM SET amrtree.fault_injection = 'reconcile:after_prune_rewrite'; SELECT pg_reload_conf();});
$primary->psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM s WHERE b && box '((0,0),(100,100))'});
$primary->wait_for_log(qr/aborting at "reconcile:after_prune_rewrite"/, $log_at);
amr_wait_for_crash_restart($primary, $log_at) or die 'the primary did not come back';
$primary->safe_psql('postgres', q{ALTER SYSTEM RESET amrtree.fault_injection; SELECT pg_reload_conf();});
unlink $primary->data_dir . '/amrtree_fault_fired';

# the second pass (by the query, or by the tier manager before it)
is($primary->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM s WHERE b && box '((-1,-1),(100,100))'}),
	$capacity, 'primary: the index finds the committed rows, none of the lost transaction');
ok($primary->wait_for_log(qr/dropped \d+ entries inserted beyond it/, $prune_at),
	'the second pass pruned to the same horizon');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('s_b')}), 't', 'primary: amrtree_check');
is($primary->safe_psql('postgres', q{SELECT leaves FROM amrtree_index_stats('s_b')}), 2,
	'primary: the split survived the pruning');

# the standby: the same leaves, so the same rows, each once
$primary->wait_for_catchup($standby);
my $query = q{SELECT count(*), count(DISTINCT id) FROM s WHERE b && box '((-1,-1),(100,100))'};
for my $scan ([ 'index scan', 'SET enable_seqscan = off; SET enable_bitmapscan = off;' ],
	[ 'bitmap scan', 'SET enable_seqscan = off; SET enable_indexscan = off;' ])
{
	is($standby->safe_psql('postgres', "$scan->[1] $query"), "$capacity|$capacity",
		"standby: an amrtree $scan->[0] returns every committed row once");
}
standby_holds_primary_entries('s_b',
	'standby: every leaf holds the entries it holds on the primary');

# --- 2. A move after a split whose record is lost
#
# A PMEM leaf splits, then the tier manager moves both halves to SSD
# without a record (each half's image is in the split's record), and the
# server crashes before any of it reached the disk.  The move must not
# lower the first half's WAL stamp below the split's record: recovery's
# pruning would then skip that half, log only the second one (which holds
# the lost entry), and the standby hold the old full leaf beside it.
# The tier manager sleeps (the moves below are amrtree_settle's), so that
# no move after the restart logs the half whole by chance.
$primary->safe_psql('postgres', q{
ALTER SYSTEM SET amrtree.scan_interval = '1h'; SELECT pg_reload_conf();
CREATE TABLE m (id int, b box);
CREATE INDEX m_b ON m USING amrtree (b) WITH (pmem_budget = '1kB');});
$primary->safe_psql('postgres', "SET amrtree.budget_on_insert = defer; "
	  . "INSERT INTO m VALUES ($_, box(point($_, $_), point($_ + 0.5, $_ + 0.5)))")
  for 1 .. $capacity;
is($primary->safe_psql('postgres', q{SELECT leaves || ' ' || entries || ' ' || ssd_bytes FROM amrtree_index_stats('m_b')}),
	"1 $capacity 0", "one PMEM leaf (over its budget until settled) holds $capacity entries");
my $origin = $primary->safe_psql('postgres', q{SELECT DISTINCT leaf_id FROM amrtree_leaf_entries('m_b')});
$primary->safe_psql('postgres', q{
INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
CHECKPOINT;});
$primary->wait_for_catchup($standby);

# the split and the moves (the settle writes no record), in a transaction
# left open: nothing flushed -- no commit, not even one without an xid,
# whose records would make the WAL writer flush the split's
my ($in, $out) = ('', '');
my $open_tx = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $primary->connstr('postgres'), '-f', '-' ],
	'<', \$in, '>', \$out, '2>&1');
$in .= qq{
BEGIN;
SET amrtree.budget_on_insert = defer;
INSERT INTO m VALUES (1000, box '((90,90),(90.5,90.5))');
SELECT amrtree_settle('m_b', 0) > 0 AS moved;
SELECT e.leaf_id <> $origin AS second_half FROM amrtree_leaf_entries('m_b') e JOIN m ON m.ctid = e.tid
WHERE m.id = 1000;
SELECT 'inserted';
};
$open_tx->pump until $out =~ /inserted/ || $out =~ /ERROR/;
is($out, "t\nt\ninserted\n",
	'a transaction split the leaf, its new entry in the second half (the first holds only old entries), '
	  . 'moved both halves, and stays open');
is($primary->safe_psql('postgres', q{SELECT leaves || ' ' || pmem_bytes FROM amrtree_index_stats('m_b')}),
	'2 0', 'the leaf split, and both halves moved to SSD');

$log_at = -s $primary->logfile;
$primary->stop('immediate');
$open_tx->kill_kill;
$primary->start;
is($primary->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM m WHERE b && box '((-1,-1),(100,100))'}),
	$capacity, 'primary: the index finds the committed rows, not the lost one');
ok($primary->wait_for_log(qr/dropped 1 entries inserted beyond it/, $log_at),
	'recovery pruned the lost entry');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('m_b')}), 't', 'primary: amrtree_check');

standby_index_scan_is(
	q{SELECT count(*), count(DISTINCT id) FROM m WHERE b && box '((-1,-1),(100,100))'},
	"$capacity|$capacity", 'standby: an amrtree index scan returns every committed row once');
standby_holds_primary_entries('m_b',
	'standby: every leaf holds the entries it holds on the primary');

# --- 3. Entries marked dead in place, the record lost
#
# VACUUM marks entries of a PMEM leaf dead in place when no slot is free
# for a rewrite (simulated: vacuum:pmem_full), and its backend crashes
# before the record reached the disk.  The primary keeps the marks (the
# rows were deleted, so the index only lost entries it no longer needed);
# the standby must lose them too: once a later VACUUM frees the rows' heap
# slots and new rows take them, a live entry left there would hand those
# new rows to its box's queries.  The new rows go to the other leaf, so
# that no change of this one after recovery logs it whole by chance.
$primary->safe_psql('postgres', q{
CREATE TABLE v (id int, b box);
CREATE INDEX v_b ON v USING amrtree (b);
INSERT INTO v SELECT g, box(point(g, g), point(g + 0.5, g + 0.5)) FROM generate_series(1, 50) g;
INSERT INTO v SELECT g, box(point(1000 + g, g), point(1000.5 + g, g + 0.5)) FROM generate_series(51, 100) g;
DELETE FROM v WHERE id <= 10;
INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
CHECKPOINT;});
$primary->wait_for_catchup($standby);
$log_at = -s $primary->logfile;
($ret) = $primary->psql('postgres', q{
SET amrtree.fault_injection = 'vacuum:pmem_full,vacuum:after_mark_dead';
VACUUM (INDEX_CLEANUP ON) v;});
isnt($ret, 0, 'VACUUM crashed right after marking entries dead in place')
  or die 'VACUUM did not reach its crash point';
amr_wait_for_crash_restart($primary, $log_at) or die 'the primary did not come back';
unlink $primary->data_dir . '/amrtree_fault_fired';
is($primary->safe_psql('postgres', q{SELECT count(*) || ' ' || count(DISTINCT leaf_id) FROM amrtree_leaf_entries('v_b') WHERE dead}),
	'10 1', 'primary: the ten entries stay dead, in one leaf');
is($primary->safe_psql('postgres', q{
SELECT count(DISTINCT leaf_id) FROM amrtree_leaf_entries('v_b') e JOIN v ON v.ctid = e.tid WHERE v.id > 50}),
	1, 'the other half of the rows is in another leaf');
$primary->safe_psql('postgres', q{
VACUUM (INDEX_CLEANUP ON) v;
INSERT INTO v SELECT 200 + g, box(point(1060 + g, g), point(1060.5 + g, g + 0.5))
  FROM generate_series(1, 10) g;});
is($primary->safe_psql('postgres', q{SELECT count(*) FROM v WHERE ctid <= '(0,10)' AND id > 200}), 10,
	'the new rows took the vacuumed rows\' heap slots');
standby_index_scan_is(q{SELECT count(*) FROM v WHERE b && box '((0,0),(100,100))'},
	40, 'standby: an amrtree index scan returns the 40 live rows of the window, none of the new ones');
standby_holds_primary_entries('v_b',
	'standby: every leaf holds the live entries it holds on the primary');

# Run $sql in a session of its own that pauses at $pause, right after its
# WAL record; make another session's commit flush that record; then let it
# go on to crash at $crash, before its change, and wait for the restart.
sub crash_after_durable_record
{
	my ($sql, $pause, $crash, $who, $record, $change) = @_;
	my $paused = $primary->data_dir . '/amrtree_fault_paused';
	my $at = -s $primary->logfile;
	my ($in, $out) = ('', '');
	my $session = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $primary->connstr('postgres'), '-f', '-' ],
		'<', \$in, '>', \$out, '2>&1');
	$in .= "SET amrtree.fault_injection = '$pause,$crash';\n$sql;\n";
	my $waited = 0;
	$session->pump_nb, usleep(50_000), $waited++ until -e $paused || $waited > 600;
	ok(-e $paused, "$who paused between $record and $change");
	$primary->safe_psql('postgres', q{INSERT INTO filler VALUES (0, 'flushes the WAL')});
	unlink $paused;
	$session->finish;
	amr_wait_for_crash_restart($primary, $at) or die 'the primary did not come back';
	like(slurp_file($primary->logfile, $at), qr/aborting at "\Q$crash\E"/,
		"and crashed before $change");
	unlink $primary->data_dir . '/amrtree_fault_fired';
	return;
}

# --- 4. An append logged as its leaf's whole image, cut off before its store
#
# The first change of a leaf after a checkpoint is logged as the leaf's
# whole image, new entry included, and an append leaves the leaf's version
# as it was.  Here that record reaches the disk (another session commits
# while the inserting backend waits between the record and the store), and
# the backend crashes before the store.  Crash recovery must put the entry
# in, as the standby does from the image: skipped because the version was
# already there, the entry stayed out of the primary's pool, the primary's
# VACUUM never marked it dead on the standby, and there the row that took
# the aborted row's heap slot was returned for the aborted row's box.
# The table's rows fill two leaves, and the row that takes the aborted
# row's heap slot goes to the other one: no change of the aborted row's
# leaf after recovery logs it whole by chance.
$primary->safe_psql('postgres', q{
CREATE TABLE a (id int, b box);
CREATE INDEX a_b ON a USING amrtree (b);
INSERT INTO a SELECT g, box(point(g, g), point(g + 0.5, g + 0.5)) FROM generate_series(1, 50) g;
INSERT INTO a SELECT g, box(point(1000 + g, g), point(1000.5 + g, g + 0.5)) FROM generate_series(51, 100) g;
INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
CHECKPOINT;});
is($primary->safe_psql('postgres', q{SELECT (SELECT leaves FROM amrtree_index_stats('a_b')) || ' ' || (SELECT max(ctid) FROM a)}),
	'2 (0,100)', 'two leaves; the rows fill the first heap page up to (0,100)');
$primary->wait_for_catchup($standby);
crash_after_durable_record(q{INSERT INTO a VALUES (101, box '((60,60),(60.5,60.5))')},
	'append:before_store', 'append:before_entry', 'an insert', 'its entry\'s record', 'the store');
is($primary->safe_psql('postgres', q{SELECT count(*) FROM amrtree_leaf_entries('a_b') WHERE NOT dead}),
	101, 'primary: crash recovery put in the entry of the whole-image record');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('a_b')}), 't', 'primary: amrtree_check');
$primary->safe_psql('postgres', q{
VACUUM (INDEX_CLEANUP ON) a;
INSERT INTO a VALUES (200, box '((1060,60),(1060.5,60.5))');
VACUUM a;});
is($primary->safe_psql('postgres', q{SELECT ctid FROM a WHERE id = 200}), '(0,101)',
	'a new row, in the other leaf, took the aborted row\'s heap slot');
standby_index_scan_is(q{SELECT count(*) FROM a WHERE b && box '((59,59),(61,61))'},
	0, 'standby: an amrtree index-only scan does not return the new row for the aborted row\'s box');
standby_holds_primary_entries('a_b',
	'standby: the leaf holds the live entries it holds on the primary');

# --- 5. Dead marks logged as their leaf's whole image, cut off before them
#
# The same for VACUUM's dead marks made in place (no slot free for a
# rewrite, simulated: vacuum:pmem_full): the record, the leaf's whole image
# with the marks, reaches the disk, and VACUUM crashes before making them.
# Crash recovery must make them, as the standby does from the image.
$primary->safe_psql('postgres', q{
CREATE TABLE d (id int, b box);
CREATE INDEX d_b ON d USING amrtree (b);
INSERT INTO d SELECT g, box(point(g, g), point(g + 0.5, g + 0.5)) FROM generate_series(1, 40) g;
DELETE FROM d WHERE id <= 10;
INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;
CHECKPOINT;});
$primary->wait_for_catchup($standby);
crash_after_durable_record(q{VACUUM (INDEX_CLEANUP ON) d},
	'vacuum:pmem_full,vacuum:after_marks_logged', 'vacuum:before_marks_stored', 'VACUUM',
	'its dead marks\' record', 'the marks');
is($primary->safe_psql('postgres', q{SELECT count(*) FILTER (WHERE dead) || ' ' || count(*) FROM amrtree_leaf_entries('d_b')}),
	'10 40', 'primary: crash recovery made the dead marks of the whole-image record');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('d_b')}), 't', 'primary: amrtree_check');
$primary->wait_for_catchup($standby);
standby_holds_primary_entries('d_b',
	'standby: the leaf holds the live entries it holds on the primary');

$standby->stop;
$primary->stop;
done_testing();

# Scans racing changes to the leaves they read.
#
# (a) A scan reading an SSD leaf that splits while the scan holds no lock.
#
# A scan reads a leaf's Leaf Table word and split links under the leaf's
# lock, and an SSD image after releasing it (the device read must not hold
# a lock).  If the word has changed by then, the leaf moved or was
# rewritten, and the scan reads it again.  It used to read only the new
# image then, without looking at the split links again: when the change was
# a split, the entries that moved to the new right leaf were never read,
# and a query returned too few rows (24 of 73 here).  Now it starts the
# read over, under the lock, and follows the right link like any scan that
# meets a leaf split after it started.
#
# The scan is paused at scan:before_ssd_read (amr_fault.c), after it let go
# of the lock and before the device read, while another session inserts
# into that leaf until it splits.  The SSD cache is off
# (amrtree.ssd_cache_size = 0), as if the image had been evicted, so the
# read goes to the device.  Each kind of scan (bitmap, plain, index-only,
# KNN) must return, in its REPEATABLE READ snapshot, exactly what a
# sequential scan returns in the same snapshot.
#
# (b) On a hot standby, a scan that opened the tree before replay left its
# inner nodes stale.  Replay publishes a split's right half in the Leaf
# Table only when it cannot link it into the inner nodes, and marks them
# to be packed at the tree's next use -- which was only the next open.  A
# scan opened earlier and rescanned (a subplan or a nested loop's inner
# side; a cursor's bitmap scan, which opens at the cursor's start)
# collected its leaves from the stale nodes and missed the right half (24
# rows of 73).  Now every read of the inner nodes packs them first if they
# are stale.  The fault condition redo:split_unlinked makes replay take
# that path.  A standby cursor runs a scan per probe: the first before the
# primary splits the leaf, the second (a rescan, the window's) after.
#
# (c) On a hot standby, replay of VACUUM under an index-only scan that is
# returning the leaf's entries (see the part's own comment below).
#
# (d), (e) VACUUM, on the primary and in replay, of entries that a split
# moved away from the leaf an index-only scan pins (see below).
#
# (f) VACUUM, on the primary and in replay, under a cursor fetched from in
# a savepoint that was rolled back (see below).
#
# (g) VACUUM, on the primary and in replay, while an ordered index-only
# scan returns rows it read before (see below).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('scanrace', conf => q{
autovacuum = off
amrtree.ssd_cache_size = 0
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');
my $paused = $node->data_dir . '/amrtree_fault_paused';

# the window covers the second of four leaves, and only it
my $window = q{box '((0.76,-1),(1.48,1))'};
my %queries = (
	bitmap => [ 'enable_indexscan = off',
		"SELECT count(*) || ':' || sum(id) FROM r WHERE b && $window" ],
	plain => [ 'enable_bitmapscan = off',
		"SELECT string_agg(id::text, ',' ORDER BY id) FROM r WHERE b && $window" ],
	index_only => [ 'enable_bitmapscan = off',
		"SELECT count(*) || ':' || sum(hashtext(b::text)) FROM r WHERE b && $window" ],
	knn => [ 'enable_bitmapscan = off',
		q{SELECT string_agg(id::text, ',') FROM
		  (SELECT id FROM r ORDER BY b <-> point '(1.1013,0.0025)' LIMIT 60) s} ],);

for my $kind (sort keys %queries)
{
	my ($setting, $query) = @{ $queries{$kind} };

	# 300 rows in a line, packed 75 to a leaf, all demoted to SSD
	$node->safe_psql('postgres', q{
DROP TABLE IF EXISTS r;
CREATE TABLE r (id int, b box);
INSERT INTO r SELECT g, box(point(g * 0.01, 0), point(g * 0.01 + 0.005, 0.005))
FROM generate_series(0, 299) g;
CREATE INDEX r_b ON r USING amrtree (b) WITH (pmem_budget = '1B');
VACUUM ANALYZE r;
SELECT amrtree_settle('r_b', 0.5);});
	is( $node->safe_psql('postgres', qq{
SELECT count(*) || ' ' || min(tier) || ' ' || max(tier)
FROM amrtree_leaf_table('r_b') WHERE mbr && $window}),
		'1 ssd ssd', "$kind: the window's one leaf is on SSD");

	# the sequential scan fixes the snapshot; the index scan pauses
	my $scan = $node->background_psql('postgres');
	my $before = $scan->query_until(qr/armed/, qq{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT 'seq=' || ($query);
SET LOCAL enable_seqscan = off;
SET LOCAL enable_indexscan = on;
SET LOCAL enable_bitmapscan = on;
SET LOCAL $setting;
SET LOCAL amrtree.fault_injection = 'scan:before_ssd_read';
\\echo armed
SELECT 'index=' || ($query);
\\echo scanned
});
	my $waited = 0;
	usleep(50_000), $waited++ until -e $paused || $waited > 600;
	ok(-e $paused, "$kind: the scan paused before reading the SSD leaf");

	# 20 rows into that leaf: it splits
	$node->safe_psql('postgres', q{
INSERT INTO r SELECT 1000 + g, box(point(0.8 + g * 0.01, 0.001), point(0.8 + g * 0.01 + 0.002, 0.002))
FROM generate_series(0, 19) g;});
	cmp_ok($node->safe_psql('postgres', qq{
SELECT count(*) FROM amrtree_leaf_table('r_b') WHERE mbr && $window}),
		'>', 1, "$kind: the leaf split meanwhile");
	unlink $paused;

	my $out = $scan->query_until(qr/scanned/, '');
	$scan->query_safe('COMMIT');
	$scan->quit;
	my ($seq) = $before =~ /^seq=(.*)$/m;
	my ($index) = $out =~ /^index=(.*)$/m;
	ok(defined $seq && length $seq, "$kind: the sequential scan answered") or diag $before;
	is($index, $seq, "$kind: the index scan returns what the sequential scan returns in its snapshot");
}

like(slurp_file($node->logfile), qr/paused at "scan:before_ssd_read"/,
	'the pauses are in the log');
is($node->safe_psql('postgres', q{SELECT amrtree_check('r_b')}), 't', 'amrtree_check');
$node->stop;

# ---- (b) a standby's replay leaves the inner nodes stale under an open scan
my $primary = amr_node('stalep', init => { allows_streaming => 1 }, conf => "autovacuum = off\n");
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION amrtree');
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'stales');
$standby->append_conf('postgresql.conf', "amrtree.fault_injection = 'redo:split_unlinked'\n");
$standby->start;

# Each query runs an amrtree scan per probe: the scan begins (and opens the
# tree) for the first probe and is rescanned for the second, the window's.
my $probes = qq{(VALUES (1, box '((2.5,-1),(2.6,1))', point '(2.9,0.0025)'),
  (2, $window, point '(1.1013,0.0025)')) p(n, w, q)};
my %nested = (
	bitmap => [ 'enable_indexscan = off',
		q{SELECT count(*) || ':' || sum(id) FROM r WHERE b && p.w} ],
	plain => [ 'enable_bitmapscan = off',
		q{SELECT string_agg(id::text, ',' ORDER BY id) FROM r WHERE b && p.w} ],
	knn => [ 'enable_bitmapscan = off',
		q{SELECT string_agg(id::text, ',') FROM (SELECT id FROM r ORDER BY b <-> p.q LIMIT 60) s} ],);
for my $kind (sort keys %nested)
{
	my ($setting, $sub) = @{ $nested{$kind} };
	my $query = "SELECT n || '=' || coalesce(($sub), '') FROM $probes";

	$primary->safe_psql('postgres', q{
DROP TABLE IF EXISTS r;
CREATE TABLE r (id int, b box);
INSERT INTO r SELECT g, box(point(g * 0.01, 0), point(g * 0.01 + 0.005, 0.005))
FROM generate_series(0, 299) g;
CREATE INDEX r_b ON r USING amrtree (b);
VACUUM ANALYZE r;});
	$primary->wait_for_catchup($standby);
	# the first use packs the inner nodes of the replayed build
	my ($with, $without) = amr_with_and_without_index($standby, 'postgres', $query);
	is($with, $without, "standby, $kind: the index answers before the split");

	# the first probe's scan runs before the split, the second's after it
	my $scan = $standby->background_psql('postgres');
	my $before = $scan->query_until(qr/first/, qq{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT 'seq' || x FROM ($query) s(x);
SET LOCAL enable_seqscan = off;
SET LOCAL enable_indexscan = on;
SET LOCAL enable_bitmapscan = on;
SET LOCAL $setting;
DECLARE c CURSOR FOR SELECT 'index' || x FROM ($query) s(x);
FETCH 1 FROM c;
\\echo first
});
	$primary->safe_psql('postgres', q{
INSERT INTO r SELECT 1000 + g, box(point(0.8 + g * 0.01, 0.001), point(0.8 + g * 0.01 + 0.002, 0.002))
FROM generate_series(0, 19) g;});
	$primary->wait_for_catchup($standby);
	# (nothing here may open the index: that would pack the nodes)
	my $out = $scan->query_until(qr/fetched/, "FETCH ALL FROM c;\n\\echo fetched\n");
	$scan->query_safe('COMMIT');
	$scan->quit;
	cmp_ok($standby->safe_psql('postgres', qq{
SELECT count(*) FROM amrtree_leaf_table('r_b') WHERE mbr && $window}),
		'>', 1, "standby, $kind: the leaf split in replay");

	my ($seq) = $before =~ /^seq2=(.*)$/m;
	my ($index) = $out =~ /^index2=(.*)$/m;
	ok(defined $seq && length $seq, "standby, $kind: the sequential scan answered") or diag $before;
	is($index, $seq,
		"standby, $kind: the scan rescanned after the split returns what the sequential scan returns");
}
is($standby->safe_psql('postgres', q{SELECT amrtree_check('r_b')}), 't', 'standby: amrtree_check');

# Parts (c)-(e): a session in a REPEATABLE READ transaction that took the
# sequential scan's rows of $rows, then opened an index-only scan cursor
# over them and fetched its first row, so that the scan pins that row's
# leaf.  With $savepoint, that fetch runs in a savepoint rolled back after
# it.  Returns the session, its output so far and the sequential rows.
sub open_ios_cursor
{
	my ($node, $rows, $savepoint) = @_;
	my ($save, $rollback) = $savepoint ? ('SAVEPOINT s;', 'ROLLBACK TO s;') : ('', '');
	my $scan = $node->background_psql('postgres', on_error_stop => 0);
	my $before = $scan->query_until(qr/first/, qq{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT 'seq=' || string_agg(b, ' ' ORDER BY b COLLATE "C") FROM ($rows) s(b);
SET LOCAL enable_seqscan = off;
SET LOCAL enable_indexscan = on;
EXPLAIN (COSTS OFF) SELECT 'row=' || b FROM ($rows) s(b);
DECLARE c CURSOR FOR SELECT 'row=' || b FROM ($rows) s(b);
$save
FETCH 1 FROM c;
$rollback
\\echo first
});
	my ($seq) = $before =~ /^seq=(.*)$/m;
	return ($scan, $before, $seq // '');
}

# The rest of the cursor, then COMMIT: every row it returned, sorted.
sub finish_ios_cursor
{
	my ($scan, $before) = @_;
	my $out = $scan->query_until(qr/fetched/, "FETCH ALL FROM c;\n\\echo fetched\n");
	$scan->query_safe('COMMIT');
	$scan->quit;
	return join(' ', sort(map { /^row=(.*)$/ ? ($1) : () } split /\n/, $before . "\n" . $out));
}

# The wait event of the process $query names, once it is Extension (an
# amrtree wait) or after 30 s, so that a waiting session outlives a failure.
sub extension_wait
{
	my ($node, $query) = @_;
	my ($wait, $tries) = ('', 0);
	until ($wait eq 'Extension' || $tries++ > 300)
	{
		usleep(100_000);
		$wait = $node->safe_psql('postgres', $query);
	}
	return $wait;
}

# ---- (c) replay removing entries a standby's index-only scan is returning
#
# An index-only scan trusts the visibility map.  On the primary, VACUUM
# waits for the scans that pin a leaf it removed entries from before the
# heap is vacuumed and the page marked all-visible.  Replay did not: an
# index-only scan on the standby that had read the leaf went on, after
# replay of the heap records, to return the removed entries' rows as
# visible (all 60 where its snapshot sees 45).  Now replay waits for the
# pin too -- for as long as max_standby_streaming_delay allows, then it
# cancels the scan's transaction as a recovery conflict.
my $vwin = q{box '((-1,-1),(10,10))'};
my $rows = "SELECT b::text FROM v WHERE b && $vwin";
my $startup_wait_event = q{SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'startup'};
for my $delay ('-1', '1s')
{
	$standby->append_conf('postgresql.conf', qq{
max_standby_streaming_delay = $delay
log_recovery_conflict_waits = on
deadlock_timeout = 100ms
});
	$standby->reload;
	# 60 rows in one leaf, over a few heap pages; every other row deleted
	# except on the first page, which stays all-visible: the scan returns
	# its first row without reading the heap, so it holds no heap buffer pin
	# (replay of the pruning would wait for that, as core's conflict)
	$primary->safe_psql('postgres', q{
DROP TABLE IF EXISTS v;
CREATE TABLE v (id int, b box, pad text) WITH (autovacuum_enabled = off);
INSERT INTO v SELECT g, box(point(g * 0.01, 0), point(g * 0.01 + 0.005, 0.005)),
  repeat('x', 400) FROM generate_series(0, 59) g;
CREATE INDEX v_b ON v USING amrtree (b);
VACUUM ANALYZE v;
DELETE FROM v WHERE id % 2 = 1 AND (ctid::text::point)[0] > 0;});
	my $live = $primary->safe_psql('postgres', 'SELECT count(*) FROM v');
	cmp_ok($live, '<', 50, "delay $delay: rows are deleted on the later heap pages");
	$primary->wait_for_catchup($standby);

	my ($scan, $before, $seq) = open_ios_cursor($standby, $rows);
	like($before, qr/Index Only Scan using v_b/, "standby, delay $delay: the cursor is an index-only scan");
	is(scalar(split / /, $seq), $live, "standby, delay $delay: the snapshot sees the live rows");
	like($before, qr/^row=\(0\.005,0\.005\),\(0,0\)$/m,
		"standby, delay $delay: the scan returned the first page's first row");
	my $conflicts = $standby->safe_psql('postgres',
		q{SELECT confl_snapshot FROM pg_stat_database_conflicts WHERE datname = 'postgres'});
	my $log_offset = -s $standby->logfile;

	# the scan holds the leaf's 60 entries; VACUUM removes the deleted ones
	$primary->safe_psql('postgres', 'VACUUM (INDEX_CLEANUP ON) v');
	my $vacuumed = $primary->lsn('insert');
	if ($delay eq '-1')
	{
		is(extension_wait($standby, $startup_wait_event), 'Extension',
			'standby: replay waits for the index-only scan');
		is($standby->safe_psql('postgres', "SELECT pg_last_wal_replay_lsn() < '$vacuumed'"),
			't', 'standby: replay has not reached the end of the VACUUM');
		is(finish_ios_cursor($scan, $before), $seq,
			'standby: the index-only scan returns what the sequential scan returns in its snapshot');
		$primary->wait_for_catchup($standby);
		pass('standby: replay goes on once the scan is done');
	}
	else
	{
		# the scan's session is idle in its transaction: replay cancels it
		$primary->wait_for_catchup($standby);
		pass("standby, delay $delay: replay went on");
		$scan->quit;
		cmp_ok($standby->safe_psql('postgres',
				q{SELECT confl_snapshot FROM pg_stat_database_conflicts WHERE datname = 'postgres'}),
			'>', $conflicts, "standby, delay $delay: the scan was cancelled as a recovery conflict");
		my $log = slurp_file($standby->logfile, $log_offset);
		like($log, qr/terminating connection due to conflict with recovery/,
			"standby, delay $delay: the scan's session was told why");
		like($log, qr/recovery still waiting after .* recovery conflict on snapshot/,
			"standby, delay $delay: log_recovery_conflict_waits reports the wait");
	}
	my ($with, $without) = amr_with_and_without_index($standby, 'postgres',
		"SELECT string_agg(b, ' ' ORDER BY b COLLATE \"C\") FROM ($rows) s(b)");
	is($with, $without, "standby, delay $delay: the index answers after replay");
}

# ---- (d), (e) a split moves entries a paused index-only scan holds
#
# An index-only scan copies the matches of the leaf it pins; a split then
# moves some of them, entries of deleted rows among them, to a new leaf,
# and VACUUM removes them there.  VACUUM waited only for the pins of the
# leaves it removed entries from, so it did not wait for this scan, the
# heap pages went all-visible, and the scan returned the deleted rows (all
# 60 where its snapshot sees 50).  Now VACUUM waits for the pins of every
# leaf it visits, as btree VACUUM takes a cleanup lock on every leaf page
# (d); on a standby, replay remembers the pinned leaf a split took entries
# from and waits for its pins too when it removes entries from the new
# leaf (e).
$standby->append_conf('postgresql.conf', "max_standby_streaming_delay = -1\n");
$standby->reload;
my $wwin = q{box '((-1,-1),(10,10))'};
my $wrows = "SELECT b::text FROM w WHERE b && $wwin";

# Parts (d)-(f): 60 rows in one leaf, one row a heap page (fillfactor), so
# that the deleted rows' pages hold nothing else and go all-visible in
# VACUUM; the scan's first row is on a page that stays all-visible (no heap
# pin).  Made on the primary, replayed on the standby.
sub make_w
{
	$primary->safe_psql('postgres', q{
DROP TABLE IF EXISTS w;
CREATE TABLE w (id int, b box, pad text) WITH (autovacuum_enabled = off, fillfactor = 10);
INSERT INTO w SELECT g, box(point(g * 0.01, 0), point(g * 0.01 + 0.005, 0.005)),
  repeat('x', 400) FROM generate_series(0, 59) g;
CREATE INDEX w_b ON w USING amrtree (b);
VACUUM ANALYZE w;
DELETE FROM w WHERE id % 2 = 1 AND id >= 40;});
	$primary->wait_for_catchup($standby);
}

# VACUUM of w for a cursor on $where: on the primary in a session of its
# own, to be finished with finish_vacuum_w; for the standby through replay.
# Also returns the query that shows what VACUUM (or the startup process)
# waits on.
sub start_vacuum_w
{
	my ($where) = @_;
	if ($where eq 'primary')
	{
		my $vacuum = $primary->background_psql('postgres');
		$vacuum->query_until(qr/started/, "\\echo started\nVACUUM (INDEX_CLEANUP ON) w;\n\\echo vacuumed\n");
		return ($vacuum, q{SELECT wait_event FROM pg_stat_activity
			WHERE query LIKE 'VACUUM (INDEX_CLEANUP ON) w%' AND state = 'active'});
	}
	$primary->safe_psql('postgres', 'VACUUM (INDEX_CLEANUP ON) w');
	return (undef, $startup_wait_event);
}

sub finish_vacuum_w
{
	my ($vacuum) = @_;
	return unless $vacuum;
	$vacuum->query_until(qr/vacuumed/, '');
	$vacuum->quit;
}

for my $where ('primary', 'standby')
{
	my $node = $where eq 'primary' ? $primary : $standby;

	make_w();

	my ($scan, $before, $seq) = open_ios_cursor($node, $wrows);
	is(scalar(split / /, $seq), 50, "$where: the snapshot sees 50 rows");
	like($before, qr/Index Only Scan using w_b/, "$where: the cursor is an index-only scan");
	like($before, qr/^row=\(0\.005,0\.005\),\(0,0\)$/m, "$where: it returned its first row");

	# 30 rows at the far end: the leaf splits, the deleted rows' entries
	# go to the new leaf.  The insert aborts: rows the scan's snapshot
	# cannot see would make the visibility map record of their pages a
	# recovery conflict with it, which holds replay before VACUUM's index
	# records (and so hides what part (e) is about).
	$primary->safe_psql('postgres', q{
BEGIN;
INSERT INTO w SELECT 100 + g, box(point(0.6 + g * 0.001, 0.001), point(0.6 + g * 0.001 + 0.0005, 0.002)),
  repeat('y', 400) FROM generate_series(0, 29) g;
ROLLBACK;});
	is($primary->safe_psql('postgres', q{
SELECT count(DISTINCT e.leaf_id) || ' ' ||
       count(*) FILTER (WHERE w.id IS NULL AND e.leaf_id = (SELECT e0.leaf_id FROM amrtree_leaf_entries('w_b') e0
                                                           JOIN w w0 ON w0.ctid = e0.tid WHERE w0.id = 0)) || ' ' ||
       count(*) FILTER (WHERE w.id IS NULL)
FROM amrtree_leaf_entries('w_b') e LEFT JOIN w ON w.ctid = e.tid}),
		'2 0 40', "$where: the leaf split, and the deleted and aborted rows' entries left the scan's leaf");
	$primary->wait_for_catchup($standby);

	my ($vacuum, $waiting) = start_vacuum_w($where);
	is(extension_wait($node, $waiting), 'Extension', "$where: VACUUM waits for the index-only scan");
	is(finish_ios_cursor($scan, $before), $seq,
		"$where: the index-only scan returns what the sequential scan returns in its snapshot");
	finish_vacuum_w($vacuum);
	$primary->wait_for_catchup($standby);
	my ($with, $without) = amr_with_and_without_index($node, 'postgres',
		"SELECT string_agg(b, ' ' ORDER BY b COLLATE \"C\") FROM ($wrows) s(b)");
	is($with, $without, "$where: the index answers after VACUUM");
}
is($primary->safe_psql('postgres', q{SELECT amrtree_check('w_b')}), 't', 'primary: amrtree_check');

# ---- (f) a cursor fetched from in a savepoint that is rolled back
#
# A pin was released when the subtransaction it was taken in ended.  But a
# cursor declared before a savepoint and fetched from inside it outlives
# ROLLBACK TO, still holding the matches of the leaf it pinned: VACUUM (or
# its replay) did not wait, and the cursor returned the deleted rows (60
# where its snapshot sees 50).  A pin now belongs to the resource owner of
# the portal that took it, as a buffer pin does.  A cursor declared inside
# the savepoint is gone after ROLLBACK TO, and so is its pin: VACUUM does
# not wait for it though its transaction is still open.
for my $where ('primary', 'standby')
{
	my $node = $where eq 'primary' ? $primary : $standby;

	make_w();

	my ($scan, $before, $seq) = open_ios_cursor($node, $wrows, 1);
	is(scalar(split / /, $seq), 50, "$where, savepoint: the snapshot sees 50 rows");
	like($before, qr/^row=\(0\.005,0\.005\),\(0,0\)$/m,
		"$where, savepoint: the cursor returned its first row inside the savepoint");
	my ($vacuum, $waiting) = start_vacuum_w($where);
	is(extension_wait($node, $waiting), 'Extension',
		"$where, savepoint: VACUUM waits for the cursor after ROLLBACK TO");
	is(finish_ios_cursor($scan, $before), $seq,
		"$where, savepoint: the cursor returns what the sequential scan returns in its snapshot");
	finish_vacuum_w($vacuum);
	$primary->wait_for_catchup($standby);
}

# the cursor of a rolled-back savepoint leaves no pin behind
$primary->safe_psql('postgres', 'DELETE FROM w WHERE id < 10');
my $holder = $primary->background_psql('postgres');
$holder->query_safe(qq{
BEGIN;
SAVEPOINT s;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
DECLARE c CURSOR FOR $wrows;
FETCH 1 FROM c;
ROLLBACK TO s;});
my $timed_out = 0;
is($primary->psql('postgres', 'VACUUM (INDEX_CLEANUP ON) w', timeout => 60, timed_out => \$timed_out), 0,
	'VACUUM does not wait for the cursor of a rolled-back savepoint');
ok(!$timed_out, 'VACUUM finished within 60 s');
$holder->query_safe('COMMIT');
$holder->quit;
my ($with, $without) = amr_with_and_without_index($primary, 'postgres',
	"SELECT string_agg(b, ' ' ORDER BY b COLLATE \"C\") FROM ($wrows) s(b)");
is($with, $without, 'the index answers after VACUUM');

# ---- (g) VACUUM under an ordered index-only scan that keeps fetching
#
# An ordered scan queues the entries of every leaf it reads and returns them
# in distance order, long after.  It used to pin every leaf it had read
# until it ended, so VACUUM (and its replay on a standby) waited for the
# whole scan -- a KNN query streaming a large result, or a cursor fetched
# bit by bit, held VACUUM for as long as it ran.  Now it pins only the
# leaf of the row it returns, as btree does, and checks when it returns a
# row that VACUUM has not removed its entry since the leaf was read (and
# skips it if VACUUM did: the row is dead to every snapshot).  VACUUM must
# finish while the scan still runs, and the scan must return exactly the
# rows its snapshot sees, in order, although the visibility map now says
# all-visible for their pages (so the executor trusts the index).
$primary->safe_psql('postgres', q{
CREATE TABLE kn (id int, b box) WITH (autovacuum_enabled = off);
INSERT INTO kn SELECT i, box(point(i % 150, i / 150), point(i % 150 + 0.5, i / 150 + 0.5))
FROM generate_series(1, 20000) i;
CREATE INDEX kn_b ON kn USING amrtree (b);
VACUUM kn;});
for my $where ('primary', 'standby')
{
	my $node = $where eq 'primary' ? $primary : $standby;
	my $class = $where eq 'primary' ? 1 : 2;

	$primary->safe_psql('postgres', "DELETE FROM kn WHERE id % 5 = $class");
	$primary->wait_for_catchup($standby);
	my $scan = $node->background_psql('postgres', on_error_stop => 0);
	my $plan = $scan->query_safe(q{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM kn;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT b <-> point '(50,50)' FROM kn ORDER BY b <-> point '(50,50)';});
	like($plan, qr/Index Only Scan using kn_b/, "$where, ordered scan: an index-only scan");
	my $expected = $scan->query_safe(q{
SET LOCAL enable_indexonlyscan = off; SET LOCAL enable_indexscan = off; SET LOCAL enable_seqscan = on;
SELECT count(*) || ' ' || sum((b <-> point '(50,50)')::numeric) FROM kn;});
	$expected = (split /\n/, $expected)[-1];
	# fetch it all, 100 rows at a time with a pause, checking the order
	$scan->query_until(qr/started/, q{
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_indexonlyscan = on;
DECLARE c CURSOR FOR SELECT b <-> point '(50,50)' FROM kn ORDER BY b <-> point '(50,50)';
\echo started
DO $$
DECLARE
	cur refcursor := 'c';
	d float8;
	last float8 := '-infinity';
	n int := 0;
	total numeric := 0;
BEGIN
	LOOP
		FETCH cur INTO d;
		EXIT WHEN NOT FOUND;
		IF d < last THEN RAISE EXCEPTION 'out of order: % after %', d, last; END IF;
		last := d;
		n := n + 1;
		total := total + d::numeric;
		IF n % 100 = 0 THEN PERFORM pg_sleep(0.08); END IF;
	END LOOP;
	PERFORM set_config('kn.fetched', n || ' ' || total, true);
END $$ /* kn_fetch_loop */;
SELECT 'fetched=' || current_setting('kn.fetched');
\echo done
});
	usleep(500_000);
	my $timed_out = 0;
	is($primary->psql('postgres', 'VACUUM (INDEX_CLEANUP ON) kn', timeout => 60, timed_out => \$timed_out),
		0, "$where, ordered scan: VACUUM");
	ok(!$timed_out, "$where, ordered scan: VACUUM finished within 60 s");
	$primary->wait_for_catchup($standby, 'replay', $primary->lsn('insert'));
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM pg_stat_activity
			  WHERE query LIKE '%kn_fetch_loop%' AND state = 'active' AND pid <> pg_backend_pid()}),
		1, "$where, ordered scan: VACUUM (and its replay) done while the scan still runs");
	ok($node->safe_psql('postgres', q{SELECT relallvisible > 0 FROM pg_class WHERE relname = 'kn'}) eq 't',
		"$where, ordered scan: VACUUM marked pages all-visible");
	my $out = $scan->query_until(qr/done/, '');
	$scan->query_safe('COMMIT');
	$scan->quit;
	my ($fetched) = $out =~ /^fetched=(\d+ [\d.]+)$/m;
	is($fetched, $expected, "$where, ordered scan: it returned, in order, the rows of its snapshot");
}

done_testing();

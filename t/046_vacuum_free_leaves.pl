# VACUUM frees the leaves it empties (amr_vacuum.c, free_empty_leaves).
#
# (a) A sliding window: each step adds 2,000 boxes further along x and
#     deletes those that fell out of an 11-step window, then VACUUM.  The
#     index must stay the same size: before this change every step left
#     about 35 empty leaves behind (the index grew without bound while GiST
#     stayed at 290 pages).  Every few steps, index, bitmap and sequential
#     scans must agree on the primary, and at the end on a hot standby that
#     replayed the frees, whose leaf count must equal the primary's.
# (b) An open cursor on the index keeps VACUUM from freeing (it cannot take
#     the index's lock at once, and must not wait for it); the cursor still
#     returns its rows, and the next VACUUM frees them.
# (c) free_empty_leaves = off keeps them.
# (d) Crashes right after the FREE_LEAVES record is flushed (recovery
#     replays it) and right after the leaves are freed (before the inner
#     nodes are packed again): the index agrees with sequential scans and
#     amrtree_check passes, on the primary and on the standby.
# (e) Crash recovery from a checkpoint before the freed leaves' last
#     changes, over a pool file that already holds the frees (a second
#     server, its pool on /dev/shm: crash recovery there replays over its
#     own pool and compares versions).  Without the fix in already_has()
#     replay gave up on the tree.
# (f) A standby that restarts (a backend crash, an immediate stop) from a
#     restartpoint before a FREE_LEAVES record, over its own pool, where
#     new leaves have taken the freed ids since: replay must keep the tree.
# (g) Crash recovery over the written-back pool file, where a delta that
#     came before the checkpoint's redo pointer names a leaf the file
#     holds freed: replay must keep the tree.
#
# The primary's pool is the default one, a file in the data directory
# written back; the standby's is on /dev/shm.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $primary = amr_node('freep', pool => undef, init => { allows_streaming => 1 }, conf => q{
autovacuum = off
restart_after_crash = on
amrtree.scan_interval = 200ms
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION amrtree');
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'frees');
$standby->append_conf('postgresql.conf', "max_standby_streaming_delay = -1\n");
$standby->start;

# The table, step s's rows (x in [s, s + 1): 2,000 small boxes), and a
# parity check over windows of the steps lo .. hi.
my $schema = q{
CREATE TABLE w (id bigserial PRIMARY KEY, step int, b box);
CREATE FUNCTION add_step(s int) RETURNS void LANGUAGE sql AS $$
  INSERT INTO w (step, b)
  SELECT s, box(point(x, y), point(x + random() * 0.002, y + random() * 0.002))
  FROM (SELECT s + random() AS x, random() AS y FROM generate_series(1, 2000)) g
$$;
-- windows across the live range; 0 rows where no step is left
CREATE FUNCTION parity(lo int, hi int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  bad int := 0;
  q box;
  op text;
  a bigint[];
  c bigint[];
  d bigint[];
BEGIN
  FOR i IN 0 .. 39 LOOP
    q := box(point(lo + (hi - lo + 1) * i / 40.0, (i % 7) / 7.0),
             point(lo + (hi - lo + 1) * i / 40.0 + 0.03 + (i % 3) * 0.2, (i % 7) / 7.0 + 0.1 + (i % 4) * 0.25));
    FOREACH op IN ARRAY ARRAY['&&', '@>', '<@'] LOOP
      SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;
      EXECUTE format('SELECT array_agg(id ORDER BY id) FROM w WHERE b %s $1', op) INTO a USING q;
      SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off;
      SET LOCAL enable_bitmapscan = on;
      EXECUTE format('SELECT array_agg(id ORDER BY id) FROM w WHERE b %s $1', op) INTO c USING q;
      SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = on;
      EXECUTE format('SELECT array_agg(id ORDER BY id) FROM w WHERE b %s $1', op) INTO d USING q;
      RESET enable_seqscan; RESET enable_bitmapscan; RESET enable_indexscan; RESET enable_indexonlyscan;
      IF a IS DISTINCT FROM d OR c IS DISTINCT FROM d THEN
        bad := bad + 1;
      END IF;
    END LOOP;
  END LOOP;
  RETURN bad;
END $$;
};
$primary->safe_psql('postgres', $schema . q{
SELECT setseed(0.46);
SELECT add_step(s) FROM generate_series(0, 10) s;
CREATE INDEX w_b ON w USING amrtree (b);
});

sub leaves
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{SELECT leaves FROM amrtree_index_stats('w_b')});
}

# leaves VACUUM VERBOSE says it freed ("newly deleted")
sub freed_from
{
	my ($err, $index) = @_;
	return $err =~ /index "\Q$index\E": pages: \d+ in total, (\d+) newly deleted/ ? $1 : 'none';
}
sub freed { return freed_from($_[0], 'w_b'); }

sub step
{
	my ($s) = @_;
	$primary->safe_psql('postgres', "SELECT add_step($s); DELETE FROM w WHERE step <= $s - 11");
	$primary->safe_psql('postgres', 'VACUUM (INDEX_CLEANUP on) w');
}

# an index replay gave up on raises an error: a failed test, not a death
sub check_node
{
	my ($node, $lo, $hi, $what) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', "SELECT parity($lo, $hi)");
	is($out, '0', "$what: index and bitmap scans agree with a sequential scan") or diag($err);
	($ret, $out, $err) = $node->psql('postgres', q{SELECT amrtree_check('w_b')});
	is($out, 't', "$what: amrtree_check") or diag($err);
}

# (a) the sliding window
my ($at15, $s);
for $s (11 .. 60)
{
	step($s);
	$at15 = leaves($primary) if $s == 15;
	check_node($primary, $s - 11, $s, "step $s") if $s % 15 == 0;
}
my $at60 = leaves($primary);
note "leaves: $at15 at step 15, $at60 at step 60";
cmp_ok($at60, '<=', int($at15 * 1.25), 'the index does not grow as the window slides');
is($primary->safe_psql('postgres', 'SELECT count(*) FROM w'),
	$primary->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('w_b')}),
	'entries equal the rows');
$primary->wait_for_catchup($standby);
check_node($standby, 49, 60, 'standby after the window');
is(leaves($standby), leaves($primary), 'the standby freed the same leaves');

# (b) an open cursor: VACUUM neither frees nor waits
my $cur = $primary->background_psql('postgres');
$cur->query_safe(q{BEGIN; SET enable_seqscan = off; SET enable_bitmapscan = off;
DECLARE c CURSOR FOR SELECT id FROM w WHERE b && box(point(50, 0), point(60, 1)) ORDER BY id});
my $expected = $primary->safe_psql('postgres',
	q{SELECT count(*) FROM w WHERE b && box(point(50, 0), point(60, 1))});
my $before = leaves($primary);
$primary->safe_psql('postgres', 'DELETE FROM w WHERE step BETWEEN 50 AND 57');
my ($ret, $out, $err) = $primary->psql('postgres', 'VACUUM (VERBOSE, INDEX_CLEANUP on) w', timeout => 60);
is($ret, 0, 'VACUUM with the index in use ends');
is(freed($err), '0', 'and frees nothing');
is(leaves($primary), $before, 'the empty leaves stay while the cursor is open');
my @rows = grep { length } split /\n/, $cur->query_safe('FETCH ALL FROM c');
is(scalar @rows, $expected, 'the cursor returns its rows');
$cur->query_safe('COMMIT');
$cur->quit;
$primary->safe_psql('postgres', 'DELETE FROM w WHERE step = 58');
($ret, $out, $err) = $primary->psql('postgres', 'VACUUM (VERBOSE, INDEX_CLEANUP on) w');
cmp_ok(freed($err), '>', 0, 'the next VACUUM frees them');
cmp_ok(leaves($primary), '<', $before, 'fewer leaves');
check_node($primary, 49, 61, 'after the cursor');

# (c) the option
$primary->safe_psql('postgres', 'ALTER INDEX w_b SET (free_empty_leaves = off)');
$primary->safe_psql('postgres', 'SELECT add_step(61), add_step(62), add_step(63)');
$before = leaves($primary);
$primary->safe_psql('postgres', 'DELETE FROM w WHERE step BETWEEN 59 AND 62');
($ret, $out, $err) = $primary->psql('postgres', 'VACUUM (VERBOSE, INDEX_CLEANUP on) w');
is(freed($err), '0', 'free_empty_leaves = off: nothing freed');
cmp_ok(leaves($primary), '>=', $before, 'the leaves stay');
$primary->safe_psql('postgres', 'ALTER INDEX w_b RESET (free_empty_leaves)');

# (d) crashes inside the freeing
my $round = 0;
for my $point ('vacuum:free_logged', 'vacuum:leaves_freed')
{
	$round++;
	my $base = 64 + $round * 10;
	$primary->safe_psql('postgres',
		"SELECT add_step(s) FROM generate_series($base, $base + 3) s");
	$primary->safe_psql('postgres', "DELETE FROM w WHERE step < $base + 3");
	$primary->safe_psql('postgres', "ALTER SYSTEM SET amrtree.fault_injection = '$point'; SELECT pg_reload_conf()");
	$before = leaves($primary);
	my $log_at = -s $primary->logfile;
	$primary->psql('postgres', 'VACUUM (INDEX_CLEANUP on) w');
	amr_wait_for_crash_restart($primary, $log_at);
	ok(-e $primary->data_dir . '/amrtree_fault_fired', "$point: the fault fired");
	unlink $primary->data_dir . '/amrtree_fault_fired';
	$primary->safe_psql('postgres', 'ALTER SYSTEM RESET amrtree.fault_injection; SELECT pg_reload_conf()');
	cmp_ok(leaves($primary), '<', $before, "$point: the leaves are freed after recovery");
	check_node($primary, $base, $base + 3, "$point: primary after recovery");
	$primary->safe_psql('postgres', "SELECT add_step($base + 4); DELETE FROM w WHERE step = $base");
	$primary->safe_psql('postgres', 'VACUUM (INDEX_CLEANUP on) w');
	check_node($primary, $base, $base + 4, "$point: primary, written and vacuumed after recovery");
	$primary->wait_for_catchup($standby);
	check_node($standby, $base, $base + 4, "$point: standby");
	is(leaves($standby), leaves($primary), "$point: the standby has the primary's leaves");
}

# (e) crash recovery over a pool that is ahead: the pool file already holds
# the frees (a pool on /dev/shm, where every change is persisted at once
# and crash recovery replays over the server's own pool, comparing
# versions), and replay starts at a checkpoint before the freed leaves'
# last whole images, which come before the FREE_LEAVES record.  Replaying
# them must not bring the freed leaves back: with the versions they got
# back they took no later record as new, and kept entries VACUUM had
# removed (t/008 found it: rows in the index whose heap tuples were gone).
my $own = amr_node('freeown', conf => "autovacuum = off\nrestart_after_crash = on\n");
$own->start;
$own->safe_psql('postgres', 'CREATE EXTENSION amrtree;' . $schema . q{
SELECT add_step(s) FROM generate_series(0, 9) s;
CREATE INDEX w_b ON w USING amrtree (b);
CHECKPOINT;
-- whole images of the leaves of steps 0-3 (their first change since the
-- checkpoint), then VACUUM empties them
SELECT add_step(s) FROM generate_series(0, 3) s;
DELETE FROM w WHERE step BETWEEN 0 AND 3;
});
($ret, $out, $err) = $own->psql('postgres', 'VACUUM (VERBOSE, INDEX_CLEANUP on) w');
cmp_ok(freed($err), '>', 0, 'own pool: VACUUM freed leaves');
$before = leaves($own);
$own->stop('immediate');
$own->start;
is(leaves($own), $before, 'own pool: recovery keeps the leaves freed');
is($own->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('w_b')}),
	$own->safe_psql('postgres', 'SELECT count(*) FROM w'),
	'own pool: entries equal the rows');
# the freed rows' TIDs taken by rows elsewhere: a resurrected entry would
# return them for windows over steps 0-3
$own->safe_psql('postgres', 'SELECT add_step(s) FROM generate_series(10, 13) s');
check_node($own, 0, 13, 'own pool: after recovery and new rows');
$own->stop;

# (f) A standby restarts from a restartpoint taken between VACUUM's last
# changes to the leaves it emptied and its FREE_LEAVES record, over its own
# pool, which already holds the frees and new leaves that took the freed
# ids since.  No record between the restartpoint and FREE_LEAVES touches the
# freed leaves, so replay meets the later leaves there, with live entries;
# and PostgreSQL calls the standby consistent at once (nothing was written
# after the restartpoint).  Replay must keep them and the tree (t/015 found
# it: "VACUUM freed leaf 20 as empty, which holds 36 live entries here", 0
# leaves on the standby).  Twice: after a standby backend crashes (the
# postmaster restarts replay) and after an immediate stop.
sub leaf_ids
{
	my ($node) = @_;
	return split /,/, $node->safe_psql('postgres',
		q{SELECT string_agg(leaf_id::text, ',' ORDER BY leaf_id) FROM amrtree_leaf_table('w_b')});
}
# no page writes on the standby after the restartpoint (room in shared
# buffers, no background writer): its consistent point stays before the
# FREE_LEAVES record
$standby->append_conf('postgresql.conf', "shared_buffers = 64MB\nbgwriter_lru_maxpages = 0\n");
$standby->restart;
$primary->safe_psql('postgres', 'SELECT add_step(s) FROM generate_series(100, 105) s');
$primary->safe_psql('postgres', 'DELETE FROM w WHERE step < 104');
my %had = map { $_ => 1 } leaf_ids($primary);
my $paused = $primary->data_dir . '/amrtree_fault_paused';
$primary->safe_psql('postgres',
	"ALTER SYSTEM SET amrtree.fault_injection = 'vacuum:before_free'; SELECT pg_reload_conf()");
my $vac = $primary->background_psql('postgres');
$vac->query_until(qr/started/, "\\echo started\nVACUUM (INDEX_CLEANUP on) w;\n\\echo vacuumed\n");
my $waited = 0;
usleep(50_000), $waited++ until -e $paused || $waited > 600;
ok(-e $paused, 'restartpoint: VACUUM paused before freeing');
$primary->safe_psql('postgres', 'CHECKPOINT');
$primary->wait_for_catchup($standby);
$standby->safe_psql('postgres', 'CHECKPOINT');
my $redo = $standby->safe_psql('postgres', 'SELECT redo_lsn FROM pg_control_checkpoint()');
unlink $paused;
$vac->query_until(qr/vacuumed/, '');
$vac->quit;
$primary->safe_psql('postgres', 'ALTER SYSTEM RESET amrtree.fault_injection; SELECT pg_reload_conf()');
my %left = map { $_ => 1 } leaf_ids($primary);
my @freed = grep { !$left{$_} } keys %had;
cmp_ok(scalar @freed, '>', 0, 'restartpoint: VACUUM freed leaves after it');
$primary->safe_psql('postgres', 'SELECT add_step(s) FROM generate_series(106, 111) s');
my %now = map { $_ => 1 } leaf_ids($primary);
my $reused = grep { $now{$_} } @freed;
note scalar(@freed) . " leaves freed, $reused of their ids taken again";
cmp_ok($reused, '>', 0, 'restartpoint: new leaves took freed ids');
$primary->wait_for_catchup($standby);
check_node($standby, 104, 111, 'restartpoint: standby before its restarts');

for my $how ('a backend crash', 'an immediate stop')
{
	my $log_at = -s $standby->logfile;
	if ($how eq 'a backend crash')
	{
		my $victim = $standby->background_psql('postgres');
		my $pid = $victim->query_safe('SELECT pg_backend_pid()');
		kill 9, $pid;
		amr_wait_for_crash_restart($standby, $log_at);
		eval { $victim->quit };
	}
	else
	{
		$standby->stop('immediate');
		$standby->start;
	}
	ok(slurp_file($standby->logfile, $log_at) =~ /redo starts at \Q$redo\E\b/,
		"standby restarted after $how: redo started at the restartpoint");
	$primary->wait_for_catchup($standby);
	check_node($standby, 104, 111, "standby restarted after $how");
	is(leaves($standby), leaves($primary), "standby restarted after $how: the primary's leaves");
	ok(!$standby->log_contains(qr/cannot follow the tree/, $log_at),
		"standby restarted after $how: replay kept the tree");
}

# (g) Crash recovery over the primary's written-back pool file (a copy, as
# a standby's pool: records are applied in order) from a checkpoint whose
# redo pointer an append's delta preceded on a stale look (t/029): the
# leaf's first record after it is that delta, then its whole image, then
# VACUUM empties and frees it.  The file already holds the free, so the
# delta names a leaf the pool does not have; the image and the free that
# follow settle it, and replay must keep the tree.
$primary->safe_psql('postgres', q{
CREATE TABLE d (id int, b box);
CREATE INDEX d_b ON d USING amrtree (b);
INSERT INTO d SELECT g, box(point(50 + g * 0.01, 0), point(50 + g * 0.01 + 0.005, 0.005))
FROM generate_series(1, 80) g;
INSERT INTO d SELECT g, box(point(g * 0.01, 0), point(g * 0.01 + 0.005, 0.005))
FROM generate_series(101, 180) g;
CHECKPOINT;
INSERT INTO d VALUES (181, box(point(0.81, 0), point(0.815, 0.005)));});
$primary->safe_psql('postgres', "ALTER SYSTEM SET amrtree.fault_injection = 'append:after_decision'; SELECT pg_reload_conf()");
my $ins = $primary->background_psql('postgres');
$ins->query_until(qr/armed/, q{
\echo armed
INSERT INTO d VALUES (182, box(point(0.82, 0), point(0.825, 0.005)));
\echo inserted
});
$waited = 0;
usleep(50_000), $waited++ until -e $paused || $waited > 600;
ok(-e $paused, 'stale delta: the append paused between its choice of a delta and its record');
my $cp_at = -s $primary->logfile;
my $cp = $primary->background_psql('postgres');
$cp->query_until(qr/started/, "\\echo started\nCHECKPOINT;\n\\echo checkpointed\n");
$waited = 0;
usleep(50_000), $waited++
  until slurp_file($primary->logfile, $cp_at) =~ /checkpoint starting: immediate force wait/ || $waited > 1200;
unlink $paused;
$ins->query_until(qr/inserted/, '');
$ins->quit;
$cp->query_until(qr/checkpointed/, '');
$cp->quit;
$primary->safe_psql('postgres', 'ALTER SYSTEM RESET amrtree.fault_injection; SELECT pg_reload_conf()');
$primary->safe_psql('postgres', 'DELETE FROM d WHERE id > 100');
($ret, $out, $err) = $primary->psql('postgres', 'VACUUM (VERBOSE, INDEX_CLEANUP on) d');
cmp_ok(freed_from($err, 'd_b'), '>', 0, 'stale delta: VACUUM freed the leaves');
my $shape = $primary->safe_psql('postgres', q{SELECT leaves || '/' || entries FROM amrtree_index_stats('d_b')});
sleep 1;    # the write-back reaches the file
$primary->stop('immediate');
my $log_at = -s $primary->logfile;
$primary->start;
amr_wait_for_server($primary) or die 'the primary did not come back';
ok(!$primary->log_contains(qr/cannot follow the tree|rebuilding index/, $log_at),
	'stale delta: crash recovery kept the tree');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('d_b')}), 't', 'stale delta: amrtree_check');
is($primary->safe_psql('postgres', q{SELECT leaves || '/' || entries FROM amrtree_index_stats('d_b')}),
	$shape, "stale delta: the leaves and entries VACUUM left ($shape)");
my ($with, $without) = amr_with_and_without_index($primary, 'postgres',
	q{SELECT string_agg(id::text, ',' ORDER BY id) FROM d WHERE b && box '((-1,-1),(60,1))'});
is($with, $without, 'stale delta: the index returns what a sequential scan returns');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT leaves || '/' || entries FROM amrtree_index_stats('d_b')}),
	$shape, 'stale delta: the standby freed them too');

$standby->stop;
$primary->stop;
done_testing();

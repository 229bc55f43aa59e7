# Parallel heap scans in CREATE INDEX and REINDEX: workers scan the table
# and stream its rows to the building backend.  Checks that workers are
# used where the planner's rule allows; that the index equals a serial
# build's and answers like a sequential scan (NULLs, deleted rows, HOT
# chains, and a snapshot older than the build that must still see the rows
# deleted since); that an error in a worker, and a cancel, fail the build
# cleanly and give back its pool storage; that with no workers to be had
# the build scans alone; that a build does not keep what an operator
# class's bounding-box function allocates per row; and that a build larger
# than maintenance_work_mem sorts runs in every participant, and fails
# cleanly.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Find;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('parbuild', conf => q{
autovacuum = off
max_worker_processes = 8
max_parallel_workers = 8
});
$node->start;

# 60,000 rows, one in 50 with a NULL box; fillfactor leaves room for HOT
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int PRIMARY KEY, b box, v int) WITH (fillfactor = 60);
INSERT INTO t SELECT g,
  CASE WHEN g % 50 = 0 THEN NULL
       ELSE box(point(x, y), point(x + 0.003, y + 0.002)) END, 0
FROM (SELECT g, (g * 7919 % 10007) / 10007.0 AS x, (g::bigint * 104729 % 10009) / 10009.0 AS y
      FROM generate_series(1, 60000) g) s;
CREATE TABLE t2 (LIKE t);
INSERT INTO t2 SELECT * FROM t;
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows SELECT g, box(point(x, y), point(x + w, y + w))
FROM (SELECT g, (g * 31 % 97) / 97.0 AS x, (g * 53 % 89) / 89.0 AS y,
             0.002 * (1 + g % 40) AS w FROM generate_series(1, 24) g) s;
VACUUM ANALYZE t;
VACUUM ANALYZE t2;
});
amr_setup_parity($node);

# pool usage: leaf ids, PMEM + SSD slots, indexes
sub usage
{
	$node->safe_psql('postgres', q{
SELECT amrtree_settle(c.oid, 0) FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'amrtree'});
	return $node->safe_psql('postgres', q{
SELECT leaf_ids_used || ' leaves, ' || pmem_slots_used + ssd_slots_used || ' slots, ' || indexes || ' indexes'
FROM amrtree_pool_stats()});
}

# Run a build with $workers maintenance workers; returns (ok, stderr).
# The build reports at DEBUG1 how many workers scanned for it.
sub build
{
	my ($sql, $workers, $extra) = @_;
	$extra ||= '';
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres', qq{
SET client_min_messages = debug1;
SET max_parallel_maintenance_workers = $workers;
SET min_parallel_table_scan_size = 0;
$extra
$sql},
		stdout => \$out, stderr => \$err);
	return ($rc == 0, $err);
}

sub entries
{
	my ($index) = @_;
	return $node->safe_psql('postgres', "SELECT entries FROM amrtree_index_stats('$index')");
}

# A snapshot older than the deletes and updates below, held open across
# the builds: what it sees must stay reachable through the new indexes.
my $old = $node->background_psql('postgres');
$old->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $old_t2 = $old->query_safe('SELECT count(*) FROM t2 WHERE b IS NOT NULL');

$node->safe_psql('postgres', q{
DELETE FROM t WHERE id % 7 = 0;
UPDATE t SET v = v + 1 WHERE id % 5 = 0;
UPDATE t SET b = box(point(0.9, 0.9), point(0.91, 0.905)) WHERE id % 11 = 0;
DELETE FROM t2 WHERE id % 3 = 0;
});

# --- 1. the parallel build, against a serial one on the same rows
my ($ok, $err) = build('CREATE INDEX t_b ON t USING amrtree (b)', 2);
ok($ok, 'parallel CREATE INDEX succeeds') or diag($err);
like($err, qr/amrtree build of "t_b": [12] parallel workers scan the table/,
	'the build scanned with parallel workers');
($ok, $err) = build('CREATE INDEX t_b_serial ON t USING amrtree (b)', 0);
ok($ok, 'serial CREATE INDEX succeeds') or diag($err);
unlike($err, qr/parallel workers scan/, 'with max_parallel_maintenance_workers = 0 the build scans alone');
is(entries('t_b'), entries('t_b_serial'), 'the parallel build indexed the same number of entries as the serial one');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b') AND amrtree_check('t_b_serial')}), 't',
	'both pass amrtree_check');
is($node->safe_psql('postgres', q{
SELECT count(DISTINCT indcheckxmin) || ':' || bool_and(indcheckxmin) FROM pg_index
WHERE indexrelid IN ('t_b'::regclass, 't_b_serial'::regclass)}), '1:true',
	'the broken HOT chains the workers met mark the index as the serial build does (indcheckxmin)');
# a serial build lists each leaf's rows in the order the heap scan met
# them, so block by block (a heap-only tuple is listed under its chain's
# root, on the same block); the parallel one in the order they arrived
is($node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE (prev::text::point)[0] > (tid::text::point)[0]) || ' out of order, '
       || (count(*) > 2 * count(DISTINCT leaf_id))::text
FROM (SELECT leaf_id, tid, lag(tid) OVER (PARTITION BY leaf_id ORDER BY entry) AS prev
      FROM amrtree_leaf_entries('t_b_serial')) s}), '0 out of order, true',
	'the serial build lists every leaf\'s rows in heap block order');
$node->safe_psql('postgres', 'DROP INDEX t_b_serial');
my ($mismatch, $rows) = amr_parity_mismatches($node, 't');
is($mismatch, 0, "the parallel-built index answers like a sequential scan ($rows rows over all strategies)");
cmp_ok($rows, '>', 1000, 'and the windows match rows');

# --- 2. rows deleted after an open snapshot: the build indexes them
# (recently dead), so that snapshot still finds them through the index
($ok, $err) = build('CREATE INDEX t2_b ON t2 USING amrtree (b)', 2);
ok($ok, 'parallel build of t2') or diag($err);
like($err, qr/parallel workers scan the table/, 't2 was scanned in parallel');
is($node->safe_psql('postgres', q{SELECT indcheckxmin FROM pg_index WHERE indexrelid = 't2_b'::regclass}),
	'f', 'no HOT chains in t2: the index is usable by older snapshots');
$old->query_safe('SET enable_seqscan = off; SET enable_indexscan = off; SET enable_bitmapscan = on');
like($old->query_safe(q{EXPLAIN (COSTS OFF) SELECT count(*) FROM t2 WHERE b && box '((0,0),(1,1))'}),
	qr/t2_b/, 'the old snapshot plans with the new index');
is($old->query_safe(q{SELECT count(*) FROM t2 WHERE b && box '((0,0),(1,1))'}), $old_t2,
	'the old snapshot finds every row it sees, including those deleted before the build');
$old->query_safe('RESET enable_seqscan; RESET enable_indexscan; RESET enable_bitmapscan');
my $live_t2 = $node->safe_psql('postgres', 'SELECT count(*) FROM t2 WHERE b IS NOT NULL');
is($node->safe_psql('postgres', q{
SET enable_seqscan = off; SELECT count(*) FROM t2 WHERE b && box '((0,0),(1,1))'}), $live_t2,
	'a new snapshot finds only the live rows');
$old->query_safe('COMMIT');
$old->quit;

# --- 3. an error in a worker fails the build and frees what it wrote
my $with_two = usage();
$node->safe_psql('postgres', q{
CREATE FUNCTION flaky_box(id int, b box) RETURNS box LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF id = current_setting('amr_test.fail_row')::int THEN
    RAISE EXCEPTION 'no box for row %', id;
  END IF;
  RETURN b;
END $$;
CREATE FUNCTION slow_box(id int, b box) RETURNS box LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF id % 500 = 0 THEN
    PERFORM pg_sleep(0.05);
  END IF;
  RETURN b;
END $$;
});
($ok, $err) = build('CREATE INDEX t_flaky ON t USING amrtree (flaky_box(id, b))', 2,
	'SET amr_test.fail_row = 45001;');
ok(!$ok, 'a build whose expression fails in a worker fails');
like($err, qr/ERROR:  no box for row 45001/, 'with the worker\'s error') or diag($err);
like($err, qr/parallel workers scan the table/, 'the failing rows were scanned by a worker');
is(usage(), $with_two, 'the failed build gave back its leaves and slots');

# --- 4. a cancel (statement_timeout) while workers scan
($ok, $err) = build('CREATE INDEX t_slow ON t USING amrtree (slow_box(id, b))', 2,
	"SET statement_timeout = '400ms';");
ok(!$ok, 'the slow parallel build was cancelled');
like($err, qr/canceling statement due to statement timeout/, 'by the statement timeout') or diag($err);
is(usage(), $with_two, 'the cancelled build gave back its leaves and slots');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'parallel worker'}),
	'0', 'no parallel worker is left behind');

# --- 5. no workers to be had: the build scans alone, with the same result
($ok, $err) = build('REINDEX INDEX t_b', 2, 'SET max_parallel_workers = 0;');
ok($ok, 'REINDEX with max_parallel_workers = 0 succeeds') or diag($err);
unlike($err, qr/parallel workers scan/, 'and scanned alone');
($mismatch, $rows) = amr_parity_mismatches($node, 't');
is($mismatch, 0, 'the serially rebuilt index answers like a sequential scan');

# --- 6. REINDEX in parallel after all that, and an expression index
($ok, $err) = build('REINDEX INDEX t_b', 2);
ok($ok, 'parallel REINDEX succeeds') or diag($err);
like($err, qr/parallel workers scan the table/, 'REINDEX scanned in parallel');
# built in another session, while this one watches its progress
my $builder = $node->background_psql('postgres');
$builder->query_safe('SET max_parallel_maintenance_workers = 2; SET min_parallel_table_scan_size = 0');
$builder->query_until(qr/started/,
	"\\echo started\nCREATE INDEX t_slow ON t USING amrtree (slow_box(id, b));\n");
# (the workers show the leader's statement in pg_stat_activity, as
# btree's do, rather than an empty query)
ok($node->poll_query_until('postgres', q{
SELECT blocks_total > 0 AND blocks_done > 0 AND blocks_done <= blocks_total
  AND (SELECT string_agg(DISTINCT query, ' | ') FROM pg_stat_activity
       WHERE backend_type = 'parallel worker')
      = 'CREATE INDEX t_slow ON t USING amrtree (slow_box(id, b));'
FROM pg_stat_progress_create_index WHERE phase = 'building index: scanning table'}),
	'while workers scan, the build reports blocks done of blocks total, and the workers its statement');
$builder->quit;
is($node->safe_psql('postgres', q{SELECT indisvalid FROM pg_index WHERE indexrelid = 't_slow'::regclass}),
	't', 'the slow expression index builds without a timeout');
is($node->safe_psql('postgres', q{
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM t WHERE slow_box(id, b) && box '((0.2,0.2),(0.6,0.7))'}),
	$node->safe_psql('postgres', q{
SET enable_indexscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM t WHERE slow_box(id, b) && box '((0.2,0.2),(0.6,0.7))'}),
	'the expression index answers like a sequential scan');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b') AND amrtree_check('t_slow')}), 't',
	'amrtree_check passes');
$node->safe_psql('postgres', 'DROP INDEX t_slow; DROP INDEX t_b; DROP INDEX t2_b');
is(usage(), '0 leaves, 0 slots, 0 indexes', 'dropping the indexes empties the pool');

# --- 7. what a bounding-box function allocates per row is freed as the
# build goes (the point class's function returns a fresh box for every
# row): a serial build on points peaks no higher than one on boxes of the
# same rows, in the same table (so the same heap pages and the same number
# of leaves).  Linux only: the backend's peak resident set from /proc.
SKIP:
{
	skip 'no /proc/<pid>/status', 1 unless -r "/proc/$$/status";
	$node->safe_psql('postgres', q{
CREATE TABLE pb AS SELECT g AS id, point(x, y) AS p, box(point(x, y), point(x, y)) AS b
FROM (SELECT g, random() AS x, random() AS y FROM generate_series(1, 1000000) g) s;
VACUUM ANALYZE pb;});
	my %growth;
	for my $col ('b', 'p')
	{
		my $s = $node->background_psql('postgres');
		my $pid = $s->query_safe('SET max_parallel_maintenance_workers = 0; SELECT pg_backend_pid()');
		$pid =~ s/\D//g;
		my $peak = sub {
			open my $fh, '<', "/proc/$pid/status" or die "/proc/$pid/status: $!";
			my ($kb) = map { /^VmHWM:\s+(\d+)/ ? $1 : () } <$fh>;
			return $kb;
		};
		my $before = $peak->();
		$s->query_safe("CREATE INDEX pb_$col ON pb USING amrtree ($col)");
		$growth{$col} = $peak->() - $before;
		$s->quit;
	}
	cmp_ok($growth{p}, '<=', $growth{b} * 1.15 + 4096,
		"a build on points peaks like one on boxes ($growth{p} kB against $growth{b} kB)");
	$node->safe_psql('postgres', 'DROP TABLE pb');
}

# --- 8. more rows than maintenance_work_mem holds (64MB holds 1,032,444):
# the leader and each worker scan blocks and sort runs of their own (the
# workers' in a shared file set); the index answers like a sequential
# scan, and an error or a cancel near the end of the scan (after the first
# runs, of about 516,000 rows a participant with one worker, were written)
# leaves no temporary file behind and gives back the pool's storage
$node->safe_psql('postgres', q{
CREATE TABLE sr (id int, b box);
INSERT INTO sr SELECT g,
  CASE WHEN g % 97 = 0 THEN NULL
       ELSE box(point(x, y), point(x + 0.002, y + 0.003)) END
FROM (SELECT g, random() AS x, random() AS y FROM generate_series(1, 1100000) g) s;
VACUUM ANALYZE sr;
CREATE FUNCTION late_slow_box(id int, b box) RETURNS box LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF id > 1050000 AND id % 5000 = 0 THEN
    PERFORM pg_sleep(0.3);
  END IF;
  RETURN b;
END $$;});

# files under the data directory's pgsql_tmp, in file sets' directories too
sub temp_files
{
	my $n = 0;
	my $dir = $node->data_dir . '/base/pgsql_tmp';
	return 0 unless -d $dir;
	File::Find::find(sub { $n++ if -f $_ }, $dir);
	return $n;
}
# sr_b holds every row once, passes amrtree_check, finds what a
# sequential scan finds (windows and NULL keys), and no run is left
sub check_sr_b
{
	my ($when) = @_;
	is(entries('sr_b'), '1100000', "every row has its entry $when");
	is($node->safe_psql('postgres', q{SELECT amrtree_check('sr_b')}), 't', "amrtree_check passes $when");
	my ($with, $without) = amr_with_and_without_index($node, 'postgres', q{
SELECT 'windows: ' || count(*) || ' ' || sum(s.id) FROM amr_windows w JOIN sr s ON s.b && w.qb
UNION ALL SELECT 'NULL: ' || count(*) || ' ' || sum(id) FROM sr WHERE b IS NULL
ORDER BY 1});
	is($with, $without, "the windows and the NULL keys: the index finds what a sequential scan finds $when");
	is(temp_files(), 0, "no run is left $when");
}
my $empty = usage();
($ok, $err) = build('CREATE INDEX sr_b ON sr USING amrtree (b)', 2,
	"SET maintenance_work_mem = '64MB';");
ok($ok, 'a parallel build larger than maintenance_work_mem succeeds') or diag($err);
like($err, qr/the leader and [12] parallel workers scan the table and sort runs of up to \d+ rows each/,
	'the leader and the workers sorted runs of their own');
check_sr_b('after the build');

# in 1MB, with the table's parallel_workers option (PostgreSQL then skips
# its rule of 32MB for each participant): runs of 5,377 rows in every
# participant, about 205 in all, more than one merge of 1MB takes, so the
# merge passes read the workers' runs as well as the leader's
$node->safe_psql('postgres', 'ALTER TABLE sr SET (parallel_workers = 2)');
($ok, $err) = build('REINDEX INDEX sr_b', 2, "SET maintenance_work_mem = '1MB';");
ok($ok, 'a parallel build in 1MB succeeds') or diag($err);
like($err, qr/the leader and [12] parallel workers scan the table and sort runs of up to 5377 rows each/,
	'the leader and the workers sorted runs of 5,377 rows');
like($err, qr/amrtree build: \d+ sorted runs, more than the \d+ one merge takes; merging them in passes/,
	'more runs than one merge takes');
check_sr_b('after the merge passes');
$node->safe_psql('postgres', 'ALTER TABLE sr RESET (parallel_workers)');

($ok, $err) = build('CREATE INDEX sr_flaky ON sr USING amrtree (flaky_box(id, b))', 2,
	"SET maintenance_work_mem = '64MB'; SET amr_test.fail_row = 1090001;");
ok(!$ok, 'a sorting build that fails in the middle of the scan fails');
like($err, qr/ERROR:  no box for row 1090001/, 'with the error of the participant that met the row')
  or diag($err);
($ok, $err) = build('CREATE INDEX sr_slow ON sr USING amrtree (late_slow_box(id, b))', 2,
	"SET maintenance_work_mem = '64MB'; SET statement_timeout = '2s';");
ok(!$ok, 'a sorting build cancelled in the middle fails');
like($err, qr/canceling statement due to statement timeout/, 'by the statement timeout') or diag($err);
is(temp_files(), 0, 'neither leaves a temporary file behind');
$node->safe_psql('postgres', 'DROP INDEX sr_b');
is(usage(), $empty, 'the failed builds gave back their leaves and slots');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'parallel worker'}),
	'0', 'no parallel worker is left behind');
$node->safe_psql('postgres', 'DROP TABLE sr');

$node->stop;
done_testing();

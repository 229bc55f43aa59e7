# Multi-transaction DDL against open scans: DROP INDEX CONCURRENTLY waiting
# for a cursor while an index is built in another database (tree numbers
# and leaf ids are cluster-wide), a cancelled DROP INDEX CONCURRENTLY,
# REINDEX CONCURRENTLY under a cursor, DROP EXTENSION / DROP DATABASE, and
# temporary tables at the end of their session and after a crash.
# A tree is freed only when its relation file is unlinked; until then
# cursors read it whole and writers keep working, and nothing leaks.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('ddl');
$node->start;

my $window = q{box '((0,0),(50,100))'};
my $setup = qq{
CREATE EXTENSION IF NOT EXISTS amrtree;
CREATE TABLE dic (id int, b box);
INSERT INTO dic SELECT i, box(point(i % 100, i / 100), point(i % 100 + 0.5, i / 100 + 0.5))
  FROM generate_series(0, 19999) i;
CREATE INDEX dic_b ON dic USING amrtree (b);
};
my $expected = $node->safe_psql('postgres',
	"$setup SELECT count(*) FROM dic WHERE b && $window");
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', q{
CREATE EXTENSION amrtree;
CREATE TABLE far (id int, b box);
INSERT INTO far SELECT i, box(point(1000 + i % 100, i / 100), point(1000 + i % 100 + 0.5, i / 100 + 0.5))
  FROM generate_series(0, 9999) i;});

# A cursor that has read 10 rows, in a session of its own.
sub open_cursor
{
	my $s = $node->background_psql('postgres');
	$s->query_safe('SET enable_seqscan = off; SET enable_bitmapscan = off; BEGIN');
	$s->query_safe("DECLARE c CURSOR FOR SELECT id, b FROM dic WHERE b && $window");
	$s->query_safe('MOVE 10 IN c');
	return $s;
}

# The rest of cursor c: rows, and rows outside the window (FETCH cannot
# run in a subquery, so the rows psql prints are checked here)
sub drain
{
	my ($s) = @_;
	my $out = $s->query_safe('FETCH ALL FROM c');
	my @rows = grep { length } split /\n/, $out;
	my $outside = 0;
	for my $r (@rows)
	{
		my ($id, $b) = split /\|/, $r;
		my ($x1, $y1, $x2, $y2) = $b =~ /\(([-\d.e]+),([-\d.e]+)\),\(([-\d.e]+),([-\d.e]+)\)/;
		# box text is (high),(low); the window is x 0..50, y 0..100
		$outside++ unless $x2 <= 50 + 1e-6 && $x1 >= 0 - 1e-6 && $y2 <= 100 + 1e-6 && $y1 >= 0 - 1e-6;
	}
	return (scalar @rows, $outside);
}

# --- 1. DROP INDEX CONCURRENTLY waits for a cursor; meanwhile an index is
# built in another database, where the freed tree number would be reused
{
	my $cursor = open_cursor();
	my $dropper = $node->background_psql('postgres');
	$dropper->query_until(qr/started/, "\\echo started\nDROP INDEX CONCURRENTLY dic_b;\n");
	$node->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'DROP INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'})
	  or die 'DROP INDEX CONCURRENTLY did not start waiting';
	$node->safe_psql('other', 'CREATE INDEX far_b ON far USING amrtree (b)');
	my $n = $node->safe_psql('postgres', 'INSERT INTO dic VALUES (-1, box \'((1,1),(2,2))\') RETURNING id');
	is($n, '-1', 'writers keep working while DROP INDEX CONCURRENTLY waits');
	my ($rows, $outside) = drain($cursor);
	is($rows, $expected - 10, 'the cursor returns every remaining row of its snapshot');
	is($outside, 0, 'and no row outside its window, though another database built an index meanwhile');
	$cursor->query_safe('COMMIT');
	$cursor->quit;
	$dropper->quit;
	is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname = 'dic_b'}), '0',
		'the drop finished once the cursor was gone');
	is($node->safe_psql('other', 'SELECT amrtree_check(\'far_b\')'), 't', 'the new index is valid');
	$node->safe_psql('other', 'DROP INDEX far_b');
}

# --- 2. a cancelled DROP INDEX CONCURRENTLY leaves a working index
$node->safe_psql('postgres', 'CREATE INDEX dic_b ON dic USING amrtree (b)');
{
	my $holder = $node->background_psql('postgres');
	$holder->query_safe('BEGIN; SELECT count(*) FROM dic');
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET statement_timeout = '300ms'; DROP INDEX CONCURRENTLY dic_b");
	like($err, qr/canceling statement due to statement timeout/, 'DROP INDEX CONCURRENTLY was cancelled');
	$holder->query_safe('COMMIT');
	$holder->quit;
	is($node->safe_psql('postgres', q{SELECT indisvalid FROM pg_index WHERE indexrelid = 'dic_b'::regclass}),
		'f', 'the index is left invalid, as PostgreSQL leaves it');
	$node->safe_psql('postgres',
		q{INSERT INTO dic SELECT -100 - i, box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 200) i;
		  UPDATE dic SET b = box '((7,7),(8,8))' WHERE id = 7; DELETE FROM dic WHERE id = 8});
	pass('INSERT, UPDATE and DELETE work on the table of the cancelled drop');
	is($node->safe_psql('postgres', q{SELECT amrtree_check('dic_b')}), 't', 'its tree is intact');
	is($node->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('dic_b')}),
		$node->safe_psql('postgres', 'SELECT count(*) + 2 FROM dic'),
		'and holds every row (and the updated and deleted rows\' old versions)');
	$node->safe_psql('postgres', 'REINDEX INDEX dic_b');
	is($node->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM dic WHERE b && $window"),
		$node->safe_psql('postgres', "SELECT count(*) FROM dic WHERE b && $window"),
		'after REINDEX it answers like a sequential scan');
}

# --- 3. REINDEX CONCURRENTLY under a cursor
{
	my $before = $node->safe_psql('postgres', "SELECT count(*) FROM dic WHERE b && $window");
	my $cursor = open_cursor();
	my $reindexer = $node->background_psql('postgres');
	$reindexer->query_until(qr/started/, "\\echo started\nREINDEX INDEX CONCURRENTLY dic_b;\n");
	$node->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'REINDEX INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'})
	  or die 'REINDEX CONCURRENTLY did not start waiting';
	my ($rows, $outside) = drain($cursor);
	is($rows, $before - 10, 'REINDEX CONCURRENTLY: the cursor reads its tree to the end');
	is($outside, 0, '... and only rows in its window');
	$cursor->query_safe('COMMIT');
	$cursor->quit;
	$reindexer->query_safe('SELECT 1');
	$reindexer->quit;
	is($node->safe_psql('postgres', q{SELECT amrtree_check('dic_b')}), 't', 'the rebuilt index is valid');
	is($node->safe_psql('postgres',
			"SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM dic WHERE b && $window"),
		$before, 'and answers through the index');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM amrtree_index_stats('dic_b')}), '1',
		'one tree for the index');
}

# leaks: every leaf of the pool belongs to a live index again
my $leaves_of_indexes = sub {
	return $node->safe_psql('postgres', q{SELECT sum(leaves) FROM amrtree_index_stats('dic_b')});
};
is($node->safe_psql('postgres', 'SELECT leaf_ids_used FROM amrtree_pool_stats()'), $leaves_of_indexes->(),
	'no tree of a dropped or superseded index is left in the pool');

# --- 4. DROP EXTENSION CASCADE and DROP DATABASE free their trees
$node->safe_psql('other', 'CREATE INDEX far_b ON far USING amrtree (b)');
$node->safe_psql('postgres', 'DROP EXTENSION amrtree CASCADE');
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');
my $far_leaves = $node->safe_psql('other', q{SELECT leaves FROM amrtree_index_stats('far_b')});
is($node->safe_psql('postgres', 'SELECT leaf_ids_used FROM amrtree_pool_stats()'), $far_leaves,
	'DROP EXTENSION CASCADE freed the trees of its indexes');
$node->safe_psql('postgres', 'DROP DATABASE other');
is($node->safe_psql('postgres', 'SELECT leaf_ids_used || \'/\' || indexes FROM amrtree_pool_stats()'), '0/0',
	'DROP DATABASE freed the trees of its indexes');

$node->restart;
is($node->safe_psql('postgres', 'SELECT leaf_ids_used || \'/\' || indexes FROM amrtree_pool_stats()'), '0/0',
	'and a restart finds nothing to reclaim');

# --- temporary tables: their trees go with the session, and with a crash
my $temp_setup = q{CREATE TEMP TABLE tmp (b box);
INSERT INTO tmp SELECT box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 3000) i;
CREATE INDEX tmp_b ON tmp USING amrtree (b);};
{
	my $s = $node->background_psql('postgres');
	$s->query_safe($temp_setup);
	is($node->safe_psql('postgres', 'SELECT indexes FROM amrtree_pool_stats()'), '1',
		'a temporary index has a tree');
	$s->quit;
	$node->poll_query_until('postgres', 'SELECT indexes = 0 FROM amrtree_pool_stats()')
	  or die 'the temporary tree outlived its session';
	is($node->safe_psql('postgres', 'SELECT leaf_ids_used || \'/\' || indexes FROM amrtree_pool_stats()'), '0/0',
		'the end of the session freed it');
}
{
	my $s = $node->background_psql('postgres');
	$s->query_safe($temp_setup);
	$node->stop('immediate');
	eval { $s->quit };
	$node->start;
	is($node->safe_psql('postgres', 'SELECT leaf_ids_used || \'/\' || indexes FROM amrtree_pool_stats()'), '0/0',
		'after a crash the temporary tree is reclaimed');
	ok($node->log_contains('reclaiming the trees of 1 indexes of temporary tables'), '... and the log says so');
}
$node->stop;
done_testing();

# Index lifecycle without leaks: after every DDL that creates, rebuilds or
# drops amrtree storage -- committed, rolled back, in savepoints, or cut
# short by a crash -- the pool's PMEM slots, SSD slots and leaf ids return to
# exactly the level the surviving indexes account for, and the indexes still
# answer like a sequential scan.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('life', conf => q{
restart_after_crash = on
autovacuum = off
amrtree.ssd_size = 64MB
max_prepared_transactions = 2
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int PRIMARY KEY, b box);
INSERT INTO t SELECT g, box(point(x, y), point(x + 0.002, y + 0.002))
FROM (SELECT g, (g * 7919 % 10007) / 10007.0 AS x, (g * 104729 % 10009) / 10009.0 AS y
      FROM generate_series(1, 20000) g) s;
});

# pool usage: leaf ids, PMEM + SSD slots, indexes
sub usage
{
	my ($db) = @_;
	# the tier manager may be moving a leaf: let it finish (moves keep the
	# number of slots, but hold one extra while in flight)
	$node->safe_psql($db || 'postgres', q{
SELECT amrtree_settle(c.oid, 0) FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'amrtree'});
	return $node->safe_psql($db || 'postgres', q{
SELECT leaf_ids_used || ' leaves, ' || pmem_slots_used + ssd_slots_used || ' slots, ' || indexes || ' indexes'
FROM amrtree_pool_stats()});
}

sub works
{
	my ($index, $what, $db) = @_;
	$db ||= 'postgres';
	is($node->safe_psql($db, "SELECT amrtree_check('$index')"), 't', "$what: amrtree_check");
	my $table = $node->safe_psql($db, "SELECT indrelid::regclass FROM pg_index WHERE indexrelid = '$index'::regclass");
	is($node->safe_psql($db, qq{
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM $table WHERE b && box '((0.2,0.2),(0.5,0.6))'}),
		$node->safe_psql($db, qq{SELECT count(*) FROM $table WHERE b && box '((0.2,0.2),(0.5,0.6))'}),
		"$what: index-only scan agrees with a sequential scan");
}

my $empty = usage();
is($empty, '0 leaves, 0 slots, 0 indexes', 'a fresh pool is empty');

$node->safe_psql('postgres', q{CREATE INDEX t_b ON t USING amrtree (b) WITH (pmem_budget = '40%')});
my $one = usage();
like($one, qr/^(\d+) leaves, \1 slots, 1 indexes$/, "one index: $one");
works('t_b', 'CREATE INDEX');

# --- DROP INDEX, and CREATE INDEX again
$node->safe_psql('postgres', 'DROP INDEX t_b');
is(usage(), $empty, 'DROP INDEX frees everything');
$node->safe_psql('postgres', q{CREATE INDEX t_b ON t USING amrtree (b) WITH (pmem_budget = '40%')});
is(usage(), $one, 'CREATE INDEX again takes the same room');

# --- rolled back CREATE INDEX, PREPARE refused
$node->safe_psql('postgres', 'BEGIN; CREATE INDEX t_b2 ON t USING amrtree (b); ROLLBACK;');
is(usage(), $one, 'a rolled-back CREATE INDEX leaves nothing');
my ($ret, $out, $err) = $node->psql('postgres',
	q{BEGIN; CREATE INDEX t_b2 ON t USING amrtree (b); PREPARE TRANSACTION 'p';});
like($err, qr/cannot PREPARE a transaction that created or dropped an amrtree index/, 'PREPARE TRANSACTION is refused');
is(usage(), $one, '... and leaves nothing');

# --- savepoints
$node->safe_psql('postgres', q{
BEGIN;
CREATE INDEX t_b2 ON t USING amrtree (b);
SAVEPOINT s;
CREATE INDEX t_b3 ON t USING amrtree (b);
ROLLBACK TO s;
SAVEPOINT s2;
DROP INDEX t_b;
ROLLBACK TO s2;
RELEASE s;
COMMIT;});
my $two = usage();
like($two, qr/ 2 indexes$/, "savepoints: the index of the rolled-back savepoint is gone ($two)");
works('t_b', 'after a DROP rolled back to a savepoint');
works('t_b2', 'index created before the savepoint');
$node->safe_psql('postgres', 'BEGIN; SAVEPOINT a; DROP INDEX t_b2; RELEASE a; COMMIT;');
is(usage(), $one, 'a DROP INDEX in a released savepoint frees at commit');

# --- TRUNCATE: rolled back, then committed
$node->safe_psql('postgres', 'BEGIN; TRUNCATE t; ROLLBACK;');
is(usage(), $one, 'a rolled-back TRUNCATE keeps the index as it was');
works('t_b', 'after a rolled-back TRUNCATE');
$node->safe_psql('postgres', q{
CREATE TABLE t_copy AS SELECT * FROM t;
BEGIN; TRUNCATE t; SAVEPOINT s; TRUNCATE t; ROLLBACK TO s; COMMIT;});
is(usage(), '0 leaves, 0 slots, 1 indexes', 'TRUNCATE leaves an empty index and frees the old leaves');
$node->safe_psql('postgres', 'INSERT INTO t SELECT * FROM t_copy');
works('t_b', 'after TRUNCATE and reload');
$node->safe_psql('postgres', 'REINDEX INDEX t_b');
is(usage(), $one, 'REINDEX INDEX: the rebuilt tree replaces the old one');
works('t_b', 'REINDEX INDEX');

# --- rebuilds that give the index a new relfilenode
for my $ddl ('REINDEX INDEX CONCURRENTLY t_b', 'REINDEX TABLE t', 'VACUUM FULL t', 'CLUSTER t USING t_pkey')
{
	$node->safe_psql('postgres', $ddl);
	is(usage(), $one, "$ddl frees the old tree");
	works('t_b', $ddl);
}
$node->safe_psql('postgres', 'BEGIN; REINDEX INDEX t_b; ROLLBACK;');
is(usage(), $one, 'a rolled-back REINDEX frees the new tree');
works('t_b', 'after a rolled-back REINDEX');

# --- CREATE / DROP INDEX CONCURRENTLY
$node->safe_psql('postgres', 'CREATE INDEX CONCURRENTLY t_b2 ON t USING amrtree (b)');
like(usage(), qr/ 2 indexes$/, 'CREATE INDEX CONCURRENTLY');
works('t_b2', 'CREATE INDEX CONCURRENTLY');
$node->safe_psql('postgres', 'DROP INDEX CONCURRENTLY t_b2');
is(usage(), $one, 'DROP INDEX CONCURRENTLY frees it');

# --- DROP TABLE
$node->safe_psql('postgres', q{
CREATE TABLE t2 AS SELECT * FROM t WHERE id % 2 = 0;
CREATE INDEX t2_b ON t2 USING amrtree (b);
CREATE UNLOGGED TABLE t3 AS SELECT * FROM t WHERE id % 3 = 0;
CREATE INDEX t3_b ON t3 USING amrtree (b);});
like(usage(), qr/ 3 indexes$/, 'two more tables with indexes');
$node->safe_psql('postgres', 'DROP TABLE t2, t3');
is(usage(), $one, 'DROP TABLE frees their indexes (logged and unlogged)');

# --- DROP DATABASE
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', q{
CREATE EXTENSION amrtree;
CREATE TABLE o AS SELECT g AS id, box(point(g, g), point(g + 1, g + 1)) AS b FROM generate_series(1, 5000) g;
CREATE INDEX o_b ON o USING amrtree (b);});
like(usage(), qr/ 2 indexes$/, 'an index in another database');
$node->safe_psql('postgres', 'DROP DATABASE other');
is(usage(), $one, 'DROP DATABASE frees the trees of its indexes');

# --- a crash in the middle of a build
my $marker = $node->data_dir . '/amrtree_fault_fired';
unlink $marker;
my $log_at = -s $node->logfile;
($ret, $out, $err) = $node->psql('postgres', q{
SET amrtree.fault_injection = 'build:after_leaf_published:25';
CREATE INDEX t_b2 ON t USING amrtree (b);});
isnt($ret, 0, 'the backend building an index crashed half-way');
amr_wait_for_crash_restart($node, $log_at) or die 'server did not come back';
unlink $marker;
is(usage(), $one, 'the half-built tree was reclaimed at restart');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname = 't_b2'}), 0,
	'and the index does not exist');
works('t_b', 'after the crash mid-build');

# --- an orphan: the DROP committed, the crash came before the storage was freed
$node->safe_psql('postgres', 'CREATE INDEX t_b2 ON t USING amrtree (b)');
$log_at = -s $node->logfile;
($ret, $out, $err) = $node->psql('postgres', q{
SET amrtree.fault_injection = 'commit:before_apply';
DROP INDEX t_b2;});
amr_wait_for_crash_restart($node, $log_at) or die 'server did not come back';
unlink $marker;
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname = 't_b2'}), 0,
	'the DROP INDEX committed before the crash');
is(usage(), $one, 'its tree, orphaned by the crash, was reclaimed at restart');
like(slurp_file($node->logfile, $log_at), qr/reclaiming the trees of 1 indexes that no longer exist/,
	'the reclamation is logged');

# --- tablespaces: copying an index's files elsewhere is refused, REINDEX
# (TABLESPACE ...) moves it
my $tsdir = PostgreSQL::Test::Utils::tempdir();
$node->safe_psql('postgres', "CREATE TABLESPACE ts LOCATION '$tsdir'");
($ret, $out, $err) = $node->psql('postgres', 'ALTER INDEX t_b SET TABLESPACE ts');
like($err, qr/amrtree index public\.t_b cannot be moved to another tablespace by copying its files/,
	'ALTER INDEX SET TABLESPACE is refused');
like($err, qr/HINT:  Rebuild it in the new tablespace: REINDEX \(TABLESPACE new_tablespace\) INDEX public\.t_b;/,
	'... with a hint');
$node->safe_psql('postgres', 'REINDEX (TABLESPACE ts) INDEX t_b');
is($node->safe_psql('postgres', q{SELECT spcname FROM pg_class c JOIN pg_tablespace s ON s.oid = c.reltablespace WHERE relname = 't_b'}),
	'ts', 'REINDEX (TABLESPACE ts) moved it');
is(usage(), $one, '... and freed the old tree');
works('t_b', 'in another tablespace');
($ret, $out, $err) = $node->psql('postgres', 'ALTER INDEX ALL IN TABLESPACE ts SET TABLESPACE pg_default');
like($err, qr/amrtree indexes cannot be moved to another tablespace/, 'ALTER INDEX ALL IN TABLESPACE is refused');
$node->safe_psql('postgres', 'CREATE DATABASE other2');
$node->safe_psql('other2', q{
CREATE EXTENSION amrtree;
CREATE TABLE o (b box);
CREATE INDEX o_b ON o USING amrtree (b);});
($ret, $out, $err) = $node->psql('postgres', 'ALTER DATABASE other2 SET TABLESPACE ts');
like($err, qr/database "other2" has amrtree indexes, which ALTER DATABASE SET TABLESPACE cannot move/,
	'ALTER DATABASE SET TABLESPACE is refused while the database has amrtree indexes');
$node->safe_psql('postgres', 'DROP DATABASE other2');
is(usage(), $one, 'level unchanged');

# --- a database copied from a template: the copy's metapages name the
# template's trees, which stay the template's; the copy's indexes have no
# tree of their own until they are rebuilt (amrtree.auto_rebuild), and the
# copy answers correctly all along
$node->safe_psql('postgres', 'CREATE DATABASE tmpl');
$node->safe_psql('tmpl', q{
CREATE EXTENSION amrtree;
CREATE TABLE o (id int, b box);
INSERT INTO o SELECT g, box(point(g % 97 / 97.0, g % 89 / 89.0), point(g % 97 / 97.0 + 0.01, g % 89 / 89.0 + 0.01))
FROM generate_series(1, 5000) g;
CREATE INDEX o_b ON o USING amrtree (b);});
my $with_template = usage();
for my $strategy ('WAL_LOG', 'FILE_COPY')
{
	my $copy = 'copy_' . lc $strategy;
	$node->safe_psql('postgres', "CREATE DATABASE $copy TEMPLATE tmpl STRATEGY $strategy");
	# writes before the rebuild skip the index; the rebuild reads the table
	$node->safe_psql($copy, 'DELETE FROM o WHERE id % 3 = 0; INSERT INTO o SELECT id + 5000, b FROM o WHERE id < 300');
	ok($node->poll_query_until($copy, q{SELECT status = 'ok' FROM amrtree_index_stats('o_b')}),
		"$strategy copy: its index is rebuilt in the background");
	works('o_b', "$strategy copy", $copy);
	works('o_b', "the template after the $strategy copy", 'tmpl');
	$node->safe_psql('postgres', "DROP DATABASE $copy");
	is(usage(), $with_template, "$strategy copy dropped: its tree is freed, the template's stays");
}
$node->safe_psql('postgres', 'DROP DATABASE tmpl');
is(usage(), $one, 'template dropped: level unchanged');

# --- clean restart: nothing changes
$node->restart;
is(usage(), $one, 'a clean restart keeps the level (the index in a tablespace is no orphan)');
works('t_b', 'after the restart');
$node->stop('immediate');
$node->start;
is(usage(), $one, 'so does a crash');
works('t_b', 'after the crash');

$node->stop;
done_testing();

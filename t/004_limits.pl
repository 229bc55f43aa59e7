# Running out of room: a full PMEM pool and a full DRAM area raise clear
# errors with hints, lose nothing, and leave the index valid; VACUUM can
# still make room in a full pool; a DRAM area too small for the rebuild at
# startup is reported until it is raised again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my ($ret, $out, $err);

# --- the PMEM pool fills up (no SSD tier to overflow to)
my $node = amr_node('pmemfull', pmem_size => '32MB', conf => "amrtree.ssd_size = 0\n");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
CREATE INDEX t_b ON t USING amrtree (b);
});
my $slots = $node->safe_psql('postgres', 'SELECT pmem_slots FROM amrtree_pool_stats()');
note "pool of 32MB has $slots slots";
my $inserted = 0;
my $full_error = '';
for my $round (1 .. 200)
{
	($ret, $out, $err) = $node->psql('postgres', qq{
INSERT INTO t SELECT i, box(point(x, y), point(x + 0.001, y + 0.001))
FROM (SELECT i, random() x, random() y FROM generate_series($inserted + 1, $inserted + 20000) i) s});
	if ($ret != 0) { $full_error = $err; last; }
	$inserted += 20000;
}
like($full_error, qr/ERROR:  amrtree PMEM pool is full \(index "t_b"\)/, 'a full pool raises a clear error');
like($full_error, qr/HINT:  Raise amrtree.pmem_size and restart the server/, '... with a hint');
# an insert may not take the last 8 slots (kept so that VACUUM can rewrite
# leaves), and the detail says so rather than "all in use"
my ($in_use) = $full_error =~ /DETAIL:  (\d+) of the pool's $slots leaf slots are in use; the last 8 are kept/;
ok(defined $in_use && $slots - $in_use >= 8,
	sprintf('... and a detail that counts the slots kept for VACUUM (%s of %d in use)', $in_use // 'none', $slots));
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $inserted, 'the failed statement left no rows');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the index is valid after the error');
is($node->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((0.2,0.2),(0.3,0.3))'}),
	$node->safe_psql('postgres', q{SET enable_indexscan = off; SET enable_bitmapscan = off; SELECT count(*) FROM t WHERE b && '((0.2,0.2),(0.3,0.3))'}),
	'queries agree with a sequential scan after the error');

# VACUUM must still work in a full pool (dead entries are marked in place),
# and the room it makes takes new rows
$node->safe_psql('postgres', 'DELETE FROM t WHERE id % 2 = 0');
($ret, $out, $err) = $node->psql('postgres', 'VACUUM t');
is($ret, 0, 'VACUUM succeeds in a full pool') or diag $err;
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the index is valid after VACUUM');
is($node->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('t_b')}),
	$node->safe_psql('postgres', 'SELECT count(*) FROM t'), 'VACUUM removed the dead entries');
($ret, $out, $err) = $node->psql('postgres', qq{
INSERT INTO t SELECT i, box(point(x, y), point(x + 0.001, y + 0.001))
FROM (SELECT i, random() x, random() y FROM generate_series(1000001, 1005000) i) s});
is($ret, 0, 'new rows fit into the room VACUUM made') or diag $err;
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the index is valid after reusing dead positions');
is($node->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((0,0),(1,1))'}),
	$node->safe_psql('postgres', 'SELECT count(*) FROM t'), 'every row is found through the index');

# raising pmem_size enlarges the pool at the next start, keeping its contents
$node->stop;
$node->adjust_conf('postgresql.conf', 'amrtree.pmem_size', "'64MB'");
$node->start;
ok($node->log_contains('enlarged PMEM pool'), 'the pool was enlarged at startup');
cmp_ok($node->safe_psql('postgres', 'SELECT pmem_slots FROM amrtree_pool_stats()'), '>', $slots, 'it has more slots');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the index survived the enlargement');
($ret, $out, $err) = $node->psql('postgres', qq{
INSERT INTO t SELECT i, box(point(x, y), point(x + 0.001, y + 0.001))
FROM (SELECT i, random() x, random() y FROM generate_series(2000001, 2100000) i) s});
is($ret, 0, 'and takes many more rows') or diag $err;
is($node->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((0,0),(1,1))'}),
	$node->safe_psql('postgres', 'SELECT count(*) FROM t'), 'every row is found through the index');
$node->stop;

# --- both tiers fill up: a clear error; VACUUM still makes room (a few slots
# are kept for operations that free a slot for each one they take)
my $both = amr_node('bothfull', pmem_size => '32MB',
	conf => "amrtree.ssd_size = 8MB\nautovacuum = off\n");
$both->start;
$both->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
CREATE INDEX t_b ON t USING amrtree (b) WITH (pmem_budget = '50%');
});
$inserted = 0;
$full_error = '';
for my $round (1 .. 200)
{
	($ret, $out, $err) = $both->psql('postgres', qq{
INSERT INTO t SELECT i, box(point(x, y), point(x + 0.001, y + 0.001))
FROM (SELECT i, random() x, random() y FROM generate_series($inserted + 1, $inserted + 20000) i) s});
	if ($ret != 0) { $full_error = $err; last; }
	$inserted += 20000;
}
like($full_error, qr/ERROR:  amrtree (SSD slot file|PMEM pool) is full/, 'both tiers full: a clear error');
like($full_error, qr/HINT:  Raise amrtree\.(ssd|pmem)_size/, '... with a hint');
is($both->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the index is valid when both tiers are full');
$both->safe_psql('postgres', 'DELETE FROM t WHERE id % 2 = 0');
($ret, $out, $err) = $both->psql('postgres', 'VACUUM (INDEX_CLEANUP ON) t');
is($ret, 0, 'VACUUM succeeds with both tiers full') or diag $err;
is($both->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('t_b')}),
	$both->safe_psql('postgres', 'SELECT count(*) FROM t'), 'VACUUM removed the dead entries from both tiers');
($ret, $out, $err) = $both->psql('postgres', qq{
INSERT INTO t SELECT i, box(point(x, y), point(x + 0.001, y + 0.001))
FROM (SELECT i, random() x, random() y FROM generate_series(5000001, 5003000) i) s});
is($ret, 0, 'rows fit again into the room VACUUM made') or diag $err;
is($both->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and the index stays valid');
is($both->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((0,0),(1,1))'}),
	$both->safe_psql('postgres', 'SELECT count(*) FROM t'), 'every row is found through the index');
$both->stop;

# --- the DRAM area fills up
my $dram = amr_node('dramfull', dram_size => '1MB');
$dram->start;
$dram->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE d (b box)');
my $created = 0;
my $dram_error = '';
for my $i (1 .. 1000)
{
	($ret, $out, $err) = $dram->psql('postgres', "CREATE INDEX d_$i ON d USING amrtree (b)");
	if ($ret != 0) { $dram_error = $err; last; }
	$created++;
}
like($dram_error, qr/ERROR:  amrtree DRAM area is full/, "a full DRAM area raises a clear error (after $created indexes)");
like($dram_error, qr/HINT:  Raise amrtree.dram_size and restart the server/, '... with a hint');
is($dram->safe_psql('postgres', "SELECT count(*) FROM pg_indexes WHERE tablename = 'd'"), $created,
	'the failed CREATE INDEX left nothing behind');
$dram->safe_psql('postgres', "INSERT INTO d SELECT box(point(i, i), point(i, i)) FROM generate_series(1, 100) i");
is($dram->safe_psql('postgres', q{SELECT amrtree_check('d_1')}), 't', 'existing indexes stay valid');

# too small for the rebuild at startup: every use says so, until raised
$dram->stop;
$dram->adjust_conf('postgresql.conf', 'amrtree.dram_size', "'256kB'");
$dram->start;
($ret, $out, $err) = $dram->psql('postgres', q{INSERT INTO d VALUES ('((1,1),(2,2))')});
like($err, qr/amrtree DRAM area is too small to hold the inner nodes of every index/, 'a DRAM area too small for the rebuild is reported');
like($err, qr/HINT:  Raise amrtree.dram_size and restart the server/, '... with a hint');
$dram->stop;
$dram->adjust_conf('postgresql.conf', 'amrtree.dram_size', "'1MB'");
$dram->start;
$dram->safe_psql('postgres', q{INSERT INTO d VALUES ('((1,1),(2,2))')});
is($dram->safe_psql('postgres', q{SELECT amrtree_check('d_1')}), 't', 'with enough DRAM everything works again');
is($dram->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM d WHERE b && '((1,1),(2,2))'}),
	'3', 'and answers through the index');
$dram->stop;

done_testing();

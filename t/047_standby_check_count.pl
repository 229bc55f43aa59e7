# amrtree_check on a hot standby while replay rewrites a leaf.  The check
# holds the tree lock exclusively and compares the entries its leaves hold
# with the tree's count, so replay must change the count together with the
# leaf, under that lock.  It changed the count after letting the locks go:
# a check that came in between said "The leaves hold 2559 entries but the
# tree counts 2558" of a sound index (the fuzzer, seed 602, shm-tiny).
# Here replay pauses right after an SSD leaf's rewrite (an append to an SSD
# leaf is replayed out of place), and the standby is checked there.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $primary = amr_node('primary', init => { allows_streaming => 1 }, conf => q{
autovacuum = off
amrtree.scan_interval = 1h
amrtree.ssd_size = 16MB
amrtree.budget_on_insert = strict
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION amrtree');
$primary->backup('b');
my $standby = amr_standby_own_pool($primary, 'b', 'standby');
$standby->start;

# created after the backup, so that the standby's pool gets the tree from
# the WAL; a budget below one leaf puts the leaves on SSD
$primary->safe_psql('postgres', q{
CREATE TABLE t (id int, b box);
INSERT INTO t SELECT g, box(point(g, g), point(g + 0.5, g + 0.5)) FROM generate_series(1, 200) g;
CREATE INDEX t_b ON t USING amrtree (b) WITH (pmem_budget = '1kB');});
$primary->wait_for_catchup($standby);
my ($pmem, $ssd) = split /\|/,
  $standby->safe_psql('postgres', q{SELECT pmem_bytes, ssd_bytes FROM amrtree_index_stats('t_b')});
ok($ssd > 0 && $pmem == 0, "the standby's leaves are on SSD (PMEM $pmem, SSD $ssd bytes)");
is($standby->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'amrtree_check holds before');

# replay pauses after its next leaf rewrite
$standby->append_conf('postgresql.conf', "amrtree.fault_injection = 'redo:after_leaf_replaced'\n");
$standby->reload;
my $paused = $standby->data_dir . '/amrtree_fault_paused';
my $waited = 0;
$primary->safe_psql('postgres', q{INSERT INTO t VALUES (1000, box '((10,10),(10.5,10.5))')});
usleep(50_000), $waited++ until -e $paused || $waited > 600;
ok(-e $paused, 'replay paused after rewriting the SSD leaf of the new entry');

my ($ret, $out, $err) = $standby->psql('postgres', q{SELECT amrtree_check('t_b')});
is($out, 't', 'amrtree_check holds while replay is between the rewrite and its next record')
  or diag $err;

unlink $paused;
$standby->append_conf('postgresql.conf', "amrtree.fault_injection = ''\n");
$standby->reload;
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and after replay went on');
is($standby->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('t_b')}),
	'201', 'the standby counts every row');
is($standby->safe_psql('postgres', q{
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM t WHERE b && box '((0,0),(2000,2000))'}),
	'201', 'and an index scan on the standby finds them');

$standby->stop;
$primary->stop;
done_testing();

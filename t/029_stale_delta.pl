# A delta logged on a stale look at the redo pointer.
#
# An append logs only its entry (a delta) when the leaf was logged whole
# since the latest checkpoint's redo pointer, else the leaf whole, so that
# replay over a copy of the pool -- a base backup's, or the write-back
# file after a crash, both of which may hold later states of a leaf --
# starts every leaf from a whole image.  The backend looks at the redo
# pointer before XLogInsert; a checkpoint that fixes a new one in between
# makes that look stale, and the delta becomes the leaf's first record
# after the redo pointer recovery starts from.  Replay then met a leaf
# already split past the delta's position and gave the tree up ("WAL
# replay cannot follow the tree"), and the index was rebuilt; CI met it in
# t/014 (2026-11-26).  Now the backend notices after the insertion
# (amr_wal_delta_came_first) and logs the leaf whole at once, and replay
# over a copy skips a delta that does not fit and awaits that image.
#
# The append is paused at append:after_decision (amr_fault.c) between its
# look and its record while a CHECKPOINT fixes its redo pointer; then the
# leaf is split by more inserts, written back, and the server crashes.
# Recovery from that checkpoint must keep the tree: no rebuild, every
# strategy agrees with a sequential scan, and the leaf awaited its image.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('stale', pool => undef, pmem_size => '64MB', conf => q{
autovacuum = off
checkpoint_timeout = 1h
max_wal_size = 4GB
amrtree.writeback_delay = 10ms
log_min_messages = debug1
});
$node->start;

# one leaf of 80 entries (a leaf holds 84), every entry in one small area
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
CREATE INDEX t_b ON t USING amrtree (b);
INSERT INTO t SELECT g, box(point(g * 0.01, 0), point(g * 0.01 + 0.005, 0.005))
FROM generate_series(1, 80) g;
CHECKPOINT;
INSERT INTO t VALUES (81, box(point(0.81, 0), point(0.815, 0.005)));});
is($node->safe_psql('postgres', q{SELECT sum(leaves) FROM amrtree_tier_stats('t_b')}), '1', 'one leaf');

# the next append chooses a delta (the leaf was logged whole after the
# checkpoint) and pauses before logging it
my $paused = $node->data_dir . '/amrtree_fault_paused';
my $ins = $node->background_psql('postgres');
$ins->query_until(qr/armed/, q{
SET amrtree.fault_injection = 'append:after_decision';
\echo armed
INSERT INTO t VALUES (82, box(point(0.82, 0), point(0.825, 0.005)));
\echo inserted
});
my $waited = 0;
usleep(50_000), $waited++ until -e $paused || $waited > 600;
ok(-e $paused, 'the append paused between its choice of a delta and its record');

# a checkpoint fixes its redo pointer meanwhile, and waits for the append
# (it logs "checkpoint starting" only once its redo pointer is fixed)
my $cp_at = -s $node->logfile;
my $cp = $node->background_psql('postgres');
$cp->query_until(qr/started/, "\\echo started\nCHECKPOINT;\n\\echo checkpointed\n");
$waited = 0;
usleep(50_000), $waited++
  until slurp_file($node->logfile, $cp_at) =~ /checkpoint starting: immediate force wait/ || $waited > 1200;
ok(slurp_file($node->logfile, $cp_at) =~ /checkpoint starting/, 'a CHECKPOINT fixed its redo pointer meanwhile');
unlink $paused;
$ins->query_until(qr/inserted/, '');
$ins->quit;
$cp->query_until(qr/checkpointed/, '');
$cp->quit;
pass('the append and the checkpoint complete');

# split the leaf well below the delta's position, and let it reach the file
$node->safe_psql('postgres', q{
INSERT INTO t SELECT g, box(point((g - 100) * 0.01, 0.01), point((g - 100) * 0.01 + 0.005, 0.015))
FROM generate_series(100, 300) g;});
cmp_ok($node->safe_psql('postgres', q{SELECT sum(leaves) FROM amrtree_tier_stats('t_b')}), '>', 2,
	'the leaf was split');
sleep 1;
$node->stop('immediate');
my $log_at = -s $node->logfile;
$node->start;
amr_wait_for_server($node) or die 'the server did not come back';

my $log = slurp_file($node->logfile, $log_at);
like($log, qr/is ahead of a delta that preceded its whole image/,
	'recovery met the delta on a leaf already past it, and awaited the image');
unlike($log, qr/cannot follow the tree|awaited a whole image|rebuilding index/,
	'the tree was kept: no rebuild');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'amrtree_check');
my ($with, $without) = amr_with_and_without_index($node, 'postgres',
	q{SELECT string_agg(id::text, ',' ORDER BY id) FROM t WHERE b && box '((0,0),(3,1))'});
is($with, $without, 'the index returns what a sequential scan returns');
is($node->safe_psql('postgres', q{SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM t WHERE b && box '((-1,-1),(5,1))'}), '283', 'it holds every row');
amr_setup_parity($node);
$node->safe_psql('postgres', q{
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows SELECT g, box(point(g * 0.07, 0), point(g * 0.07 + 0.3, 0.012))
FROM generate_series(0, 20) g;});
my ($mismatch, $rows) = amr_parity_mismatches($node, 't');
is($mismatch, '0', "every strategy on 21 windows agrees with a sequential scan ($rows rows)");

$node->stop;
done_testing();

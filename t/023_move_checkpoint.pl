# A checkpoint waits for the tier manager's logged move.
#
# The first move of a leaf after a checkpoint's redo pointer is logged
# whole, and the mover holds DELAY_CHKPT_START from the record to the
# switch, so that no checkpoint completes in between (docs/design.md,
# "WAL": a base backup or a crash recovery that starts after the record
# must find the switch made).  The checkpointer honours that flag only for
# processes with a virtual transaction id; the tier manager, a background
# worker, has one only inside a transaction, so its cycles run in one.
#
# On a PMEM pool (/dev/shm, no write-back fence of its own), the tier
# manager is paused at move:after_logged (amr_fault.c) in the middle of a
# demotion; a CHECKPOINT started then must still be waiting a few seconds
# later, and complete once the move goes on.  Then the moved index agrees
# with a sequential scan.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('movecp', conf => "autovacuum = off\namrtree.ssd_size = 64MB\n");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
INSERT INTO t SELECT i, box(point(i % 100, i / 100), point(i % 100 + 0.5, i / 100 + 0.5))
FROM generate_series(1, 5000) i;
CREATE INDEX t_b ON t USING amrtree (b);
VACUUM ANALYZE t;});
is($node->safe_psql('postgres', q{SELECT coalesce(sum(leaves), 0) FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}),
	'0', 'every leaf starts on PMEM');

my $paused = $node->data_dir . '/amrtree_fault_paused';

# the tier manager (and only it: nobody calls amrtree_settle) demotes
$node->safe_psql('postgres', q{
ALTER SYSTEM SET amrtree.fault_injection = 'move:after_logged';
SELECT pg_reload_conf();
ALTER INDEX t_b SET (pmem_budget = '20%');
SELECT count(*) FROM t WHERE b && box '((1,1),(2,2))';});
my $waited = 0;
usleep(50_000), $waited++ until -e $paused || $waited > 600;
ok(-e $paused, 'the tier manager paused between a move\'s record and its switch');
ok($node->log_contains(qr/paused at "move:after_logged"/), 'and said so in the log');

my $cp = $node->background_psql('postgres');
$cp->query_until(qr/started/, "\\echo started\nCHECKPOINT;\n\\echo checkpointed\n");
sleep 3;
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE query = 'CHECKPOINT;' AND state = 'active'}),
	'1', 'a CHECKPOINT started meanwhile is still waiting 3 s later');

unlink $paused;
$cp->query_until(qr/checkpointed/, '');
$cp->quit;
pass('it completes once the move is made');

$node->safe_psql('postgres', q{ALTER SYSTEM RESET amrtree.fault_injection; SELECT pg_reload_conf();});
$node->safe_psql('postgres', q{SELECT amrtree_settle('t_b', 0)});
cmp_ok($node->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}),
	'>', 0, 'leaves were demoted');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'amrtree_check');
amr_setup_parity($node);
$node->safe_psql('postgres', q{
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows SELECT g, box(point(g * 7 % 100, g * 3 % 50), point(g * 7 % 100 + 5, g * 3 % 50 + 4))
FROM generate_series(1, 12) g;});
my ($mismatch, $rows) = amr_parity_mismatches($node, 't');
is($mismatch, '0', "every strategy on 12 windows agrees with a sequential scan ($rows rows)");

$node->stop;
done_testing();

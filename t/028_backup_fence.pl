# A checkpoint, and so a base backup, waits for the write-back fence at
# every instant, including the one in which the write-back worker holds no
# virtual transaction id.
#
# The worker holds checkpoints through DELAY_CHKPT_COMPLETE on a vxid and
# releases one by taking a new vxid; between ending its transaction and
# beginning the next it holds none.  A checkpoint that looked for holders
# then used to complete unfenced, and a base backup taken by it got a pool
# file older than its redo pointer: the restored server could not trust it
# and rebuilt every index (docs/design.md, "Fences").  The partner holds a
# second vxid across that instant.
#
#  1. The worker is paused at writeback:between_vxids (amr_fault.c) after
#     changes to the index; pg_basebackup started then is still waiting for
#     its checkpoint 3 s later, and finishes once the worker goes on.  The
#     pool file it copied is complete up to the backup's redo pointer, and
#     the restored server uses the index at once, with no rebuild: every
#     strategy agrees with a sequential scan there.
#  2. Neither process stops checkpoints for good: with the partner
#     terminated, and with the worker terminated, CHECKPOINT completes, and
#     both come back.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('bkfence', pool => undef, pmem_size => '64MB',
	init => { allows_streaming => 1 }, conf => "autovacuum = off\n");
$node->start;
amr_load_porto($node, 't', 20000, 28);
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE INDEX t_b ON t USING amrtree (b);
VACUUM ANALYZE t;});
amr_setup_parity($node);
amr_porto_windows($node);

ok(write_back_running(), 'write-back runs with its partner');

# --- 1. a base backup while the worker holds no vxid
my $paused = $node->data_dir . '/amrtree_fault_paused';
$node->safe_psql('postgres', q{
ALTER SYSTEM SET amrtree.fault_injection = 'writeback:between_vxids';
SELECT pg_reload_conf();});
my $waited = 0;
usleep(50_000), $waited++ until -e $paused || $waited > 600;
ok(-e $paused, 'the write-back worker paused between two transactions');
ok($node->log_contains(qr/paused at "writeback:between_vxids"/), 'and said so in the log');
# not in the backup's configuration (the pause is already reached)
$node->safe_psql('postgres', q{
ALTER SYSTEM RESET amrtree.fault_injection;
SELECT pg_reload_conf();});

# changes the backup's checkpoint must find in the file: splits, a VACUUM
$node->safe_psql('postgres', q{
INSERT INTO t (id, b, t)
SELECT 100000 + g, box(point(-8.61 + (g % 50) * 0.00005, 41.15 + (g / 50) * 0.00005),
  point(-8.61 + (g % 50) * 0.00005 + 0.00003, 41.15 + (g / 50) * 0.00005 + 0.00003)), 0
FROM generate_series(1, 3000) g;
DELETE FROM t WHERE id % 7 = 0;
VACUUM t;});
my $want = $node->safe_psql('postgres', 'SELECT md5(string_agg(id::text, \',\' ORDER BY id)) FROM t');

my $backup = $node->backup_dir . '/gap';
my ($out, $err) = ('', '');
my $h = IPC::Run::start(['pg_basebackup', '-D', $backup, '-c', 'fast', '-X', 'stream', '--no-sync',
		'-d', $node->connstr('postgres')], '>', \$out, '2>', \$err);
# wait until it waits (a slow machine takes a while to connect), then 3 s more
$waited = 0;
usleep(100_000), $waited++
  until $node->safe_psql('postgres', q{SELECT phase FROM pg_stat_progress_basebackup}) eq 'waiting for checkpoint to finish'
  || $waited > 600;
sleep 3;
is($node->safe_psql('postgres', q{SELECT phase FROM pg_stat_progress_basebackup}),
	'waiting for checkpoint to finish', 'pg_basebackup is still waiting for its checkpoint 3 s later');
unlink $paused;
ok($h->finish, 'it finishes once the worker goes on') or diag($err);

my ($start, $fenced, $writeback) = backup_pool_header($backup);
ok($writeback == 0 || $fenced >= $start,
	sprintf('the copied pool is complete up to the backup\'s redo pointer (%X, fenced %X)', $start, $fenced));

my $restored = PostgreSQL::Test::Cluster->new('restored');
$restored->init_from_backup($node, 'gap');
$restored->start;
ok(!$restored->log_contains('is not complete up to') && !$restored->log_contains('dropped the trees'),
	'restored: the pool is trusted, no tree is dropped');
is($restored->safe_psql('postgres', 'SELECT md5(string_agg(id::text, \',\' ORDER BY id)) FROM t'), $want,
	'restored: the table holds the primary\'s rows');
like($restored->safe_psql('postgres', q{SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM t WHERE b && box '((-8.62,41.14),(-8.60,41.16))'}),
	qr/t_b/, 'restored: the index is used at once');
is($restored->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'restored: amrtree_check');
my ($mismatch, $rows) = amr_parity_mismatches($restored, 't');
is($mismatch, '0', "restored: every strategy on 31 windows agrees with a sequential scan ($rows rows)");
ok(!$restored->log_contains('rebuilding index'), 'restored: nothing was rebuilt');
$restored->stop;

# --- 2. neither process holds checkpoints for good
for my $who ('amrtree write-back partner', 'amrtree write-back')
{
	my $pid = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = '$who'");
	like($pid, qr/^\d+$/, "$who runs");
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	my ($ret, $stdout, $stderr) = $node->psql('postgres', 'CHECKPOINT', timeout => 60);
	is($ret, 0, "$who terminated: CHECKPOINT completes") or diag($stderr);
	$waited = 0;
	usleep(100_000), $waited++ until write_back_running() || $waited > 300;
	ok(write_back_running(), "$who terminated: write-back runs with its partner again");
	($ret, $stdout, $stderr) = $node->psql('postgres', 'CHECKPOINT', timeout => 60);
	is($ret, 0, "$who back: CHECKPOINT completes") or diag($stderr);
}
($mismatch, $rows) = amr_parity_mismatches($node, 't');
is($mismatch, '0', "primary: every strategy agrees with a sequential scan ($rows rows)");

$node->stop;
done_testing();

sub write_back_running
{
	return $node->safe_psql('postgres', 'SELECT pool FROM amrtree_pool_stats()') =~ /write-back running,/;
}

# The backup's redo pointer (backup_label) and, from its copy of the pool
# file, the header's writeback state and fenced_redo.
sub backup_pool_header
{
	my ($dir) = @_;
	my $label = slurp_file("$dir/backup_label");
	my ($hi, $lo) = $label =~ m{START WAL LOCATION: ([0-9A-F]+)/([0-9A-F]+)} or die 'no start in backup_label';
	my (undef, $header) = amr_pool_header("$dir/pg_amrtree/pmem.pool");
	return (hex($hi) * 2**32 + hex($lo), $header->{fenced_redo}, $header->{writeback});
}

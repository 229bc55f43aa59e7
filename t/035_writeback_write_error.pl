# The write-back worker cannot write the pool file (an I/O error, a full
# disk, a file-size limit): the pages it had taken off the dirty bitmap
# must stay dirty, the file must not be recorded complete, and the writes
# must be retried, so that nothing is lost at a later crash or restart.
#
# The failure is real: the worker's RLIMIT_FSIZE is lowered (prlimit, as
# the server's own user) below the Leaf Table, so every write of a Leaf
# Table or slot page fails with EFBIG while the header, below the limit,
# can still be written.  The worker restarts without the limit.
#
#  1. with write-back held off (amrtree.writeback_delay = 1h), rows are
#     inserted and a CHECKPOINT makes the worker fence: the fence fails,
#     the log names the pool file and the error, and the CHECKPOINT
#     completes only once the restarted worker has written the pages;
#     after a crash, every index answers as a sequential scan;
#  2. the same with background write-back (20 ms) and a clean shutdown.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

if (system('prlimit --version >/dev/null 2>&1') != 0)
{
	plan skip_all => 'prlimit (util-linux) is not installed';
}

# WAL segments of 1 MB: the worker also writes WAL (it flushes it before
# the pages that depend on it), and must be able to below the limit
my $node = amr_node('wberr', pool => undef, pmem_size => '64MB',
	init => { extra => ['--wal-segsize=1'] }, conf => q{
wal_level = replica
checkpoint_timeout = 1h
max_wal_size = 1GB
min_wal_size = 4MB
autovacuum = off
amrtree.writeback_delay = 1h
amrtree.ssd_size = 0
});
$node->start;
my $pool = $node->data_dir . '/pg_amrtree/pmem.pool';

$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id serial, b box);
INSERT INTO t (b) SELECT box(point(x, y), point(x + random() * 3, y + random() * 3))
  FROM (SELECT random() * 1000 AS x, random() * 1000 AS y FROM generate_series(1, 20000)) s;
CREATE INDEX t_b ON t USING amrtree (b);
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows SELECT i, box(point(x, y), point(x + w, y + w))
  FROM (SELECT i, (i * 137) % 1000 AS x, (i * 311) % 1000 AS y, 1 + (i % 5) * 25 AS w
        FROM generate_series(1, 40) i) s;
CHECKPOINT;
});
amr_setup_parity($node);

my ($header_at, $header) = amr_pool_header($pool);
my $limit = $header->{lt_offset};
cmp_ok($header_at + 4096, '<=', $limit, 'the header lies below the Leaf Table');

sub worker_pid
{
	for (1 .. 300)
	{
		my $pid = $node->safe_psql('postgres',
			"SELECT pid FROM pg_stat_activity WHERE backend_type = 'amrtree write-back'");
		return $pid if $pid ne '';
		usleep(100_000);
	}
	die 'the write-back worker did not start';
}

# Lower the file-size limit of the running worker: its writes at or past
# $limit fail with EFBIG (SIGXFSZ is ignored by every server process).
sub limit_worker
{
	my $pid = worker_pid();
	system('prlimit', "--pid=$pid", "--fsize=$limit") == 0
	  or die "prlimit on pid $pid failed";
	return $pid;
}

sub insert_rows
{
	my ($n) = @_;
	$node->safe_psql('postgres', qq{
INSERT INTO t (b) SELECT box(point(x, y), point(x + 1, y + 1))
  FROM (SELECT random() * 1000 AS x, random() * 1000 AS y FROM generate_series(1, $n)) s});
}

sub check_all
{
	my ($what) = @_;
	amr_check_index_agrees($node, $what, 't', 't_b', 20, 10);
	my $heap = $node->safe_psql('postgres', 'SELECT count(*) FROM t WHERE b IS NOT NULL');
	is($node->safe_psql('postgres', "SELECT entries FROM amrtree_index_stats('t_b')"), $heap,
		"$what: the index holds the heap's $heap entries");
}

# --- 1. a fence fails, then a crash
my $log_at = -s $node->logfile;
my $pid = limit_worker();
insert_rows(3000);
# the fence writes every dirty page; it fails, and the restarted worker
# fences again before the checkpoint may complete
$node->safe_psql('postgres', 'CHECKPOINT');
my $log = slurp_file($node->logfile, $log_at);
like($log, qr/could not write to amrtree pool "pg_amrtree\/pmem\.pool".*: File too large/,
	'the failed write is logged with the pool file and the error');
isnt(worker_pid(), $pid, 'the worker restarted');
unlike($log, qr/PANIC/, 'no PANIC');
$node->stop('immediate');
$node->start;
check_all('crash after a failed fence');

# --- 2. background write-back fails, then a clean shutdown
$node->adjust_conf('postgresql.conf', 'amrtree.writeback_delay', '20ms');
$node->reload;
$log_at = -s $node->logfile;
$pid = limit_worker();
insert_rows(3000);
$node->wait_for_log(qr/could not write to amrtree pool/, $log_at);
# a checkpoint at once, before the restarted worker (1 s) writes anything
$node->safe_psql('postgres', 'CHECKPOINT');
$node->stop('fast');
$node->start;
check_all('clean shutdown after a failed background write');

done_testing();
